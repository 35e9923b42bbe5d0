"""Where a worker's time goes, per stage of each inference call, as histograms on disk.

    clock = StageClock(model_name, Path("logs/stages"))   # a thread rewrites logs/stages/<model>-<pid>.json
    start = now(); ...decode...; clock.record(Stage.DECODE, start, now(), requests=1)
    clock.answered(OK)                                      # or the refusal's reason: "bad_input", ...
    summary = summarize(merge(read_stage_files(Path("logs/stages")))[model_name])   # make status, the bench

Stages of one call, in order: the wait for it since the previous answer, TorchServe's frame read
from the frontend's socket, decoding the requests, the model call (collate + the backend),
formatting the answers, encoding and writing the answer frame. Each is timed in wall time into a
fixed set of buckets, and the worker process's CPU time in it (all its threads: a backend's own
inference threads too) is added up beside it: wall time alone cannot tell work from being
preempted, and on a machine the frontend shares, a stage's wall time holds the frontend's turns.
One `now()` is a `perf_counter()` and a `process_time()` (~0.3 µs together, 12 per call); a
thread of the worker rewrites the file within a second of a change (~0.1 ms each time, off the
request's path), whether or not another request comes.
The frontend's own time (its queue) is TorchServe's `ts_queue_latency_microseconds`.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path


class Stage(enum.StrEnum):
    # Idle: from the last answer sent to this call's first byte (handlers/worker.py). Under load
    # with requests queued in the frontend, this is its hand-off time, which the worker waits out.
    WAIT = "wait"
    READ = "read"  # the request frame, from its first byte to parsed
    DECODE = "decode"  # body -> input tensors, every request of the call
    MODEL = "model"  # collate + the optimized model
    FORMAT = "format"  # output rows -> answers (+ status and headers)
    WRITE = "write"  # the answer frame encoded and sent


WORK = tuple(stage for stage in Stage if stage is not Stage.WAIT)  # a call's own time, added up as "all"

# Upper bounds in ms: 0.02 ms to 10 s, ~12 % apart (enough for p50/p99 within ~6 %).
BOUNDS_MS: tuple[float, ...] = tuple(round(0.02 * 1.12**i, 4) for i in range(116))
FLUSH_S = 1.0  # how often a worker's writer looks for a change to write
SUFFIX = ".json"
OK = "ok"  # a request answered; a refused one is counted by its reason (handlers/payload.py)
FAILED = "failed"  # the handler raised: TorchServe answered the request's error


@dataclasses.dataclass
class Instant:
    """A point in a call: wall time and the process's CPU time, in seconds."""

    __slots__ = ("wall", "cpu")

    def __init__(self, wall: float, cpu: float):
        self.wall, self.cpu = wall, cpu


def now() -> Instant:
    return Instant(time.perf_counter(), time.process_time())


def bucket_quantile(counts: list[int], bounds: tuple[float, ...], q: float) -> float | None:
    """The q-quantile of what `counts` holds (a count per bucket, the last past `bounds`): the upper
    bound of the bucket it falls in (the last bound for the overflow); None when empty."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = q * total, 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank and count:
            return bounds[min(index, len(bounds) - 1)]
    return bounds[-1]


@dataclasses.dataclass
class Histogram:
    counts: list[int] = dataclasses.field(default_factory=lambda: [0] * (len(BOUNDS_MS) + 1))  # last: overflow
    calls: int = 0
    requests: int = 0
    total_ms: float = 0.0
    cpu_ms: float = 0.0  # the process's CPU time in the stage, added up (no histogram: the mean is what is compared)

    def add(self, ms: float, requests: int, cpu_ms: float = 0.0) -> None:
        self.counts[bisect.bisect_left(BOUNDS_MS, ms)] += 1
        self.calls += 1
        self.requests += requests
        self.total_ms += ms
        self.cpu_ms += cpu_ms

    def merge(self, other: Histogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.calls += other.calls
        self.requests += other.requests
        self.total_ms += other.total_ms
        self.cpu_ms += other.cpu_ms

    def quantile(self, q: float) -> float | None:
        """The q-quantile of the calls, in ms: the upper bound of the bucket it falls in."""
        return bucket_quantile(self.counts, BOUNDS_MS, q)


@dataclasses.dataclass(frozen=True)
class StageSummary:
    calls: int
    requests: int
    ms_per_request: float  # mean: the stage's time divided among the requests it served
    cpu_ms_per_request: float  # the same for its CPU time
    p50_ms: float  # per call
    p99_ms: float


class StageClock:
    """One worker's histograms; `out_dir` None keeps them in memory only (a handler outside a server)."""

    def __init__(self, model: str, out_dir: Path | None):
        self.model = model
        self.out_dir = out_dir
        self.start()

    def start(self) -> None:
        """Empty histograms, and a writer of this process's file (a thread of this process)."""
        self.pid = os.getpid()
        self.path = self.out_dir / f"{self.model}-{self.pid}{SUFFIX}" if self.out_dir else None
        self.histograms = {stage: Histogram() for stage in Stage}
        self.outcomes: dict[str, int] = {}  # requests by how they ended: OK, a refusal's reason, FAILED
        self.records = 0  # the writer's cue
        self.writer = None if self.path is None else Rewriter(self.path, self.text, lambda: self.records).start()

    def record(self, stage: Stage, start: Instant, end: Instant, requests: int) -> None:
        self.own()
        self.histograms[stage].add((end.wall - start.wall) * 1000, requests, (end.cpu - start.cpu) * 1000)
        self.records += 1

    def answered(self, outcome: str, requests: int = 1) -> None:
        self.own()
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + requests
        self.records += 1

    def own(self) -> None:
        if os.getpid() != self.pid:
            # A forked child (a peer app's decode processes): no writer thread came with it, and
            # what the parent recorded is the parent's file's. A file of its own from here.
            self.start()

    def text(self) -> str:
        record = {
            "model": self.model,
            "pid": os.getpid(),
            "bounds_ms": BOUNDS_MS,
            "stages": {stage.value: dataclasses.asdict(h) for stage, h in self.histograms.items()},
            "outcomes": dict(self.outcomes),
        }
        return json.dumps(record)


class StoppedClock(StageClock):
    """A clock that records nothing and writes no file: the stage metrics switched off
    (handlers/switches.py), to measure what they cost."""

    def __init__(self) -> None:
        super().__init__("", None)

    def record(self, stage: Stage, start: Instant, end: Instant, requests: int) -> None:
        pass

    def answered(self, outcome: str, requests: int = 1) -> None:
        pass


class Rewriter:
    """A daemon thread that rewrites a worker's file within FLUSH_S of a change (`version` moved),
    whether or not another request comes: a reader a second after the last answer counts it."""

    def __init__(self, path: Path, text: Callable[[], str | None], version: Callable[[], int]):
        self.path, self.text, self.version = path, text, version
        self.written = -1
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"rewrite {path.name}", daemon=True)

    def start(self) -> Rewriter:
        self.write()
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        while not self.stopped.wait(FLUSH_S):
            if self.version() != self.written:
                self.write()

    def write(self) -> None:
        self.written = self.version()  # read first: a change while writing is written next time
        text = self.text()  # None: not now (it changed while read)
        if text is None:
            self.written = -1
            return
        replace_file(self.path, text)


def replace_file(path: Path, text: str) -> None:
    """`path` rewritten whole: a reader sees the old text or the new, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def read_records(directory: Path, suffix: str, bounds_key: str, bounds: tuple[float, ...]) -> Iterable[dict]:
    """The JSON record of every worker file `*suffix` in `directory` whose buckets are `bounds`
    (a file of another bucket layout, or replaced while read, is skipped)."""
    for path in sorted(directory.glob(f"*{suffix}")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if tuple(record.get(bounds_key, ())) == bounds:
            yield record


@dataclasses.dataclass(frozen=True)
class WorkerStages:
    """What one worker's file holds."""

    model: str
    pid: int
    histograms: dict[Stage, Histogram]
    outcomes: dict[str, int]  # requests by how they ended


def read_workers(stages_dir: Path) -> Iterable[WorkerStages]:
    for record in read_records(stages_dir, SUFFIX, "bounds_ms", BOUNDS_MS):
        histograms = {Stage(name): Histogram(**fields) for name, fields in record["stages"].items()}
        yield WorkerStages(record["model"], record["pid"], histograms, record.get("outcomes", {}))


def read_stage_files(stages_dir: Path) -> Iterable[tuple[str, dict[Stage, Histogram]]]:
    """(model, histograms) of every worker file in `stages_dir`."""
    for worker in read_workers(stages_dir):
        yield worker.model, worker.histograms


def merge(workers: Iterable[tuple[str, dict[Stage, Histogram]]]) -> dict[str, dict[Stage, Histogram]]:
    """Per model, every worker's histograms added up."""
    models: dict[str, dict[Stage, Histogram]] = {}
    for model, histograms in workers:
        merged = models.setdefault(model, {stage: Histogram() for stage in Stage})
        for stage, histogram in histograms.items():
            merged[stage].merge(histogram)
    return models


def difference(after: dict[Stage, Histogram], before: dict[Stage, Histogram] | None) -> dict[Stage, Histogram]:
    """What was recorded between two reads of one model's merged histograms (a bench row's window)."""
    if before is None:
        return after
    out = {}
    for stage, histogram in after.items():
        earlier = before.get(stage, Histogram())
        out[stage] = Histogram(
            [a - b for a, b in zip(histogram.counts, earlier.counts, strict=True)],
            histogram.calls - earlier.calls,
            histogram.requests - earlier.requests,
            histogram.total_ms - earlier.total_ms,
            histogram.cpu_ms - earlier.cpu_ms,
        )
    return out


def summarize(histograms: dict[Stage, Histogram]) -> dict[Stage, StageSummary]:
    return {
        stage: StageSummary(
            h.calls,
            h.requests,
            round(h.total_ms / h.requests, 3),
            round(h.cpu_ms / h.requests, 3),
            h.quantile(0.5),
            h.quantile(0.99),
        )
        for stage, h in histograms.items()
        if h.requests
    }


def stage_table(models: dict[str, dict[Stage, Histogram]]) -> list[str]:
    """Lines of a table: per model and stage, calls, mean wall and CPU ms per request, p50 and p99
    wall ms per call; "all" adds up the call's own stages, not the wait before it."""
    lines = [f"{'model':12} {'stage':7} {'calls':>8} {'ms/request':>10} {'cpu ms/req':>10} {'p50 ms':>8} {'p99 ms':>8}"]
    for model, histograms in sorted(models.items()):
        summaries = summarize(histograms)
        for stage, s in summaries.items():
            lines.append(
                f"{model:12} {stage.value:7} {s.calls:8d} {s.ms_per_request:10.3f} {s.cpu_ms_per_request:10.3f} "
                f"{s.p50_ms:8.3f} {s.p99_ms:8.3f}"
            )
        if summaries:
            work = [s for stage, s in summaries.items() if stage in WORK]
            wall, cpu = sum(s.ms_per_request for s in work), sum(s.cpu_ms_per_request for s in work)
            model_cpu = summaries[Stage.MODEL].cpu_ms_per_request if Stage.MODEL in summaries else 0.0
            lines.append(
                f"{model:12} {'all':7} {'':>8} {wall:10.3f} {cpu:10.3f}   (wait not included; "
                f"CPU outside the model call: {cpu - model_cpu:.3f} ms/request)"
            )
    return lines
