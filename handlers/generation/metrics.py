"""A generation engine's serving numbers, with vLLM's meanings, in a file the metrics endpoint reads.

    metrics = EngineMetrics()                         # the scheduler records into it (scheduler.py)
    writer(path, model, metrics, gauges).start()      # a thread: the file rewritten each second it changed
    read_engine_files(run_dir / "stages")             # [(model, pid, Snapshot)]: kit/metrics_text.py

Recorded as they happen, on the engine's thread: a request's wait in the queue, its time to first
token, the gap before each later token, its whole time, its prompt and generated tokens, why it
ended, what the prefix cache found of its prompt, what prompt lookup drafted and kept. Gauges
(running and waiting sequences, the KV cache's use) are read when the file is written. The file
is rewritten within a second of a change, whether or not another request comes: a scrape a
second after the last answer counts it.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from handlers.stages import Rewriter, bucket_quantile, read_records

# Upper bounds in seconds, 1 ms to about 20 minutes, 25 % apart (a quantile within ~12 %).
BOUNDS_S: tuple[float, ...] = tuple(round(0.001 * 1.25**i, 6) for i in range(64))
SUFFIX = ".engine"  # <model>-<pid>.engine beside the stage files (handlers/stages.py's <model>-<pid>.json)


@dataclasses.dataclass
class Histogram:
    counts: list[int] = dataclasses.field(default_factory=lambda: [0] * (len(BOUNDS_S) + 1))  # last: overflow
    total: float = 0.0  # seconds, summed
    count: int = 0

    def add(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BOUNDS_S, seconds)] += 1
        self.total += seconds
        self.count += 1

    def quantile(self, q: float) -> float | None:
        """The q-quantile, in seconds: the upper bound of the bucket it falls in."""
        return bucket_quantile(self.counts, BOUNDS_S, q)


@dataclasses.dataclass
class Gauges:
    running: int = 0  # sequences generating
    waiting: int = 0  # sequences queued for a place
    kv_cache_usage: float = 0.0  # the KV cache's share holding sequences' tokens, 0..1
    prefix_store_bytes: int = 0  # what the prefix store holds beside the rows (prefix_store.py)


@dataclasses.dataclass
class EngineMetrics:
    """What the engine's thread records; `changes` counts the records (the writer's cue)."""

    queue: Histogram = dataclasses.field(default_factory=Histogram)  # submitted -> admitted
    first_token: Histogram = dataclasses.field(default_factory=Histogram)  # submitted -> its first token
    inter_token: Histogram = dataclasses.field(default_factory=Histogram)  # each later token after the one before
    request: Histogram = dataclasses.field(default_factory=Histogram)  # submitted -> ended
    prompt_tokens: int = 0  # a request's prompt, once for its choices
    generation_tokens: int = 0
    finished: dict[str, int] = dataclasses.field(default_factory=dict)  # by finish reason
    prefix_queried_tokens: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hit_tokens: int = 0  # of them, found computed
    draft_tokens: int = 0  # prompt lookup's drafts
    accepted_tokens: int = 0  # of them, kept
    preemptions: int = 0  # sequences put back in the queue to make room in the KV cache
    # Requests by how the handler took them: "ok" (queued, then answered or cancelled), or the
    # refusal's reason (handlers/payload.py's, "overload" for a full queue): kit_requests_total.
    outcomes: dict[str, int] = dataclasses.field(default_factory=dict)
    changes: int = 0

    def answered(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.changes += 1

    def ended(self, reason: str, seconds: float, prompt_tokens: int, generated: int) -> None:
        self.request.add(seconds)
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generated
        self.changes += 1

    def admitted(self, waited: float, prompt_tokens: int, hit_tokens: int) -> None:
        self.queue.add(waited)
        self.prefix_queried_tokens += prompt_tokens
        self.prefix_hit_tokens += hit_tokens
        self.changes += 1

    def token(self, first: bool, seconds: float) -> None:
        (self.first_token if first else self.inter_token).add(seconds)
        self.changes += 1

    def preempted(self) -> None:
        self.preemptions += 1
        self.changes += 1

    def drafted(self, drafted: int, kept: int) -> None:
        self.draft_tokens += drafted
        self.accepted_tokens += kept
        self.changes += 1


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One worker's file: its metrics and its gauges when written."""

    metrics: EngineMetrics
    gauges: Gauges

    def as_json(self, model: str) -> str:
        return json.dumps(
            {
                "model": model,
                "pid": os.getpid(),
                "bounds_s": BOUNDS_S,
                "metrics": dataclasses.asdict(self.metrics),
                "gauges": dataclasses.asdict(self.gauges),
            }
        )

    @classmethod
    def parse(cls, record: dict) -> Snapshot:
        fields = dict(record["metrics"])
        for name in ("queue", "first_token", "inter_token", "request"):
            fields[name] = Histogram(**fields[name])
        return cls(EngineMetrics(**fields), Gauges(**record["gauges"]))


def writer(path: Path, model: str, metrics: EngineMetrics, gauges: Callable[[], Gauges]) -> Rewriter:
    """The worker's file of `metrics`, rewritten within a second of a change (not yet started)."""

    def text() -> str | None:
        try:
            return Snapshot(metrics, gauges()).as_json(model)
        except RuntimeError:  # the engine's thread added a finish reason while it was copied
            return None

    return Rewriter(path, text, lambda: metrics.changes)


def read_engine_files(directory: Path) -> Iterable[tuple[str, int, Snapshot]]:
    """(model, pid, snapshot) of every engine file in `directory`."""
    for record in read_records(directory, SUFFIX, "bounds_s", BOUNDS_S):
        yield record["model"], int(record["pid"]), Snapshot.parse(record)
