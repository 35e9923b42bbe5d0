"""What a bench run measured, as records: filled by the runner, read by the report and the tuner.

    run = BenchRun(plan, command, RunEnvironment.capture())
    run.results.append(RowResult(...)); add_derived(run.results)

Every record is a dataclass that `dataclasses.asdict` turns into results.json as it is.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from kit.paths import ROOT
from kit.topology import read_topology

# Where every bench run writes: bench/results/<run>/ (not committed; latest links the newest).
RESULTS = Path(__file__).resolve().parent / "results"

if TYPE_CHECKING:  # the plan is what was run
    from bench.plan import Plan


@dataclasses.dataclass(frozen=True)
class Measured:
    """What an in-process or peer child reports: throughput and agreement with float32 eager."""

    items_per_s: float
    cosine_mean: float
    cosine_min: float
    top1_agreement: float


@dataclasses.dataclass
class RowResult:
    """One served row: a real TorchServe under ab."""

    model: str
    name: str
    kind: str  # served
    variant: str
    runtime: str  # the backend that runs the model inside TorchServe
    precompiled: bool  # the backend compiles at archive time: workers only load (cold-start target)
    precision: str  # a DType: float32 | bfloat16 | int8
    placement: str  # plan | launcher | none
    objective: str  # placement plan: throughput | latency
    allocator: str  # what the workers were given (OpenVINO keeps glibc malloc whatever the preset says)
    omp_wait_policy: str
    workers: int | None  # per model (placement plan: as planned)
    threads: int | None  # per worker (the plan's widest)
    cpus: str  # the row's CPU set ("" = all this process may use)
    batch_size: int
    max_batch_delay_ms: int
    concurrency: int
    payload: str  # bench/payloads.py: what each request sent
    baseline: bool
    # AbResult's fields, under the same names:
    complete: int
    failed: int
    non_2xx: int
    requests_per_s: float
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    duration_s: float
    items_per_s: float  # one item per HTTP request: requests_per_s
    start_to_ready_s: float
    ts_inference_ms: float | None
    ts_queue_ms: float | None
    allocator_loaded: list[str]  # read from each worker's /proc/PID/maps
    cpu_affinity: list[list[int]]
    worker_rss_mb: list[float]
    # RSS of the processes TorchServe's launcher leaves as every worker's parent (placement launcher).
    launcher_rss_mb: float
    worker_count: int
    ab_command: str
    worker_load_s: float | None = None  # slowest worker's spawn-to-READY (TorchServe's WorkerLoadTime)
    in_process_items_per_s: float | None = None
    # Agreement with float32 eager on held-out inputs, from the in-process run of the same archive.
    cosine_mean: float | None = None
    cosine_min: float | None = None
    top1_agreement: float | None = None
    speedup_vs_baseline: float | None = None
    served_vs_in_process: float | None = None
    # Per CPU, the share of the ab window it was busy (/proc/stat): an idle core shows as ~0.
    cpu_busy: dict[str, float] = dataclasses.field(default_factory=dict)
    # CPU ms per request of each process group during the ab window (bench/cpu_accounting.py):
    # frontend, workers (this model's), other workers, launchers, other, ab.
    cpu_ms_per_request: dict[str, float] = dataclasses.field(default_factory=dict)
    # ITT ranges the workers recorded (kit/itt.py), the requests they cover (the k of each
    # "<model>:bs<k>"), and the requests the frontend answered, warm-up included.
    itt_ranges: int | None = None
    itt_requests: int | None = None
    requests_answered: int | None = None
    # PSS of each worker after the ab window (kit/footprint.py): pages shared between workers
    # (libraries, memory-mapped weights) divided among them; their sum is what the row really held.
    worker_pss_mb: list[float] = dataclasses.field(default_factory=list)
    # The workers' time per stage of a call during the ab window (handlers/stages.py): stage ->
    # calls, requests, ms_per_request, cpu_ms_per_request, p50_ms, p99_ms; a served peer's decode,
    # model and format (bench/versus/apps.py). Empty for in-process rows and TorchServe's own worker.
    stages: dict[str, dict] = dataclasses.field(default_factory=dict)
    round: int = 0  # interleaved rounds (bench/versus/rounds.py): which one measured this


@dataclasses.dataclass
class InProcessResult:
    """A row without a server: the kit's own model in-process, or a peer runtime."""

    model: str
    name: str
    kind: str  # in_process | peer
    runtime: str
    precision: str
    batch_size: int
    workers: int
    threads: int
    items_per_s: float
    cosine_mean: float
    cosine_min: float
    top1_agreement: float


@dataclasses.dataclass(frozen=True)
class RowFailure:
    """A row that did not finish (its server did not start, ab failed, ...): the run goes on."""

    model: str
    name: str
    kind: str  # served | served_peer
    baseline: bool
    reason: str  # the first line of the error: for a server, what its log says went wrong
    log: str  # the row's server directory or log file


@dataclasses.dataclass(frozen=True)
class RunEnvironment:
    """The machine and software a run measured: never compare numbers across CPUs."""

    cpu_model: str
    cores: int
    torch: str
    torchserve: str
    python: str
    git_commit: str
    date: str
    topology: list[str] = dataclasses.field(default_factory=list)  # `python -m kit topology`

    @classmethod
    def capture(cls) -> RunEnvironment:
        def version(package: str) -> str:
            try:
                return metadata.version(package)
            except metadata.PackageNotFoundError:
                return ""

        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return cls(
            cpu_model=cpu,
            cores=len(os.sched_getaffinity(0)),
            torch=version("torch"),
            torchserve=version("torchserve"),
            python=platform.python_version(),
            git_commit=commit.stdout.strip(),
            date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            topology=read_topology().summary(),
        )


def study_report(out: Path, title: str, what: str, table: Callable[[str], str], records: dict[str, list]) -> str:
    """A study's report.md (its table under a header naming the command, the commit and the CPU)
    and results.json (the environment and each list of records), printed too; the report's text."""
    environment = RunEnvironment.capture()
    header = (
        f"# {title}\n\n`{' '.join(sys.argv)}` at {environment.git_commit}; {what}; CPU: {environment.cpu_model} "
        f"({environment.cores} CPUs usable)."
    )
    text = table(header)
    (out / "report.md").write_text(text)
    document = {"environment": dataclasses.asdict(environment)}
    document |= {key: [dataclasses.asdict(r) for r in rows] for key, rows in records.items()}
    (out / "results.json").write_text(json.dumps(document))
    print(text)
    return text


@dataclasses.dataclass
class BenchRun:
    """One run of a plan, filled in row by row, so an interrupted run still reports what it measured."""

    plan: Plan
    command: str
    environment: RunEnvironment
    results: list[RowResult] = dataclasses.field(default_factory=list)
    references: list[InProcessResult] = dataclasses.field(default_factory=list)  # in-process and peers
    skipped: list[str] = dataclasses.field(default_factory=list)  # "row label: why"
    failed: list[RowFailure] = dataclasses.field(default_factory=list)

    def lost(self) -> list[str]:
        """What the run's result depends on and did not measure: a model's baseline row, or every
        served row of a model (then no comparison, and no tuned choice, exists for it)."""
        measured = {r.model for r in self.results if r.kind == "served"}
        lost = [f"{f.model}: the baseline row {f.name!r} failed" for f in self.failed if f.baseline]
        failed_models = {f.model for f in self.failed if f.kind == "served"}
        lost += [f"{model}: every served row failed" for model in sorted(failed_models - measured)]
        return lost


def add_derived(results: list[RowResult]) -> None:
    """Speed-up over the model's baseline row and served/in-process ratio, per row."""
    baselines = {r.model: r.requests_per_s for r in results if r.baseline}
    for r in results:
        if r.model in baselines and baselines[r.model] > 0:
            r.speedup_vs_baseline = round(r.requests_per_s / baselines[r.model], 2)
        if r.in_process_items_per_s:
            r.served_vs_in_process = round(r.items_per_s / r.in_process_items_per_s, 3)
