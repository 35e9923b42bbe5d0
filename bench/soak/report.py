"""The soak's records, its pass/fail verdicts and its Markdown: what `make soak` writes.

    report = SoakReport(settings, soak, kill, restart, evaluate(settings, soak, kill, restart))
    Path("soak.md").write_text(markdown(report, command))

The phases that fill these records (and the thresholds they measure against) are in bench/soak/run.py.
"""

from __future__ import annotations

import dataclasses

from handlers.typed_config import SettingsError
from kit.models import model_names
from kit.server import START_DEADLINE_S

RECOVERED_FRACTION = 0.85  # of the pre-kill rate; run-to-run noise on 2 shared cores is ~10 %


@dataclasses.dataclass(frozen=True)
class SoakSettings:
    preset: str = "optimized"
    models: tuple[str, ...] = dataclasses.field(default_factory=lambda: tuple(model_names()))
    seconds: int = 300  # soak length
    concurrency: int = 8
    kill_model: str = ""  # "": the first served model
    before_kill_s: int = 10  # load before the kill: the reference rate
    after_recovery_s: int = 10  # load after the replacement is READY, a window
    # Windows measured after READY until one is back at RECOVERED_FRACTION: a shared VM's host slows
    # it for seconds at a time (make bench-steadiness), a replacement that cannot serve in none.
    recovery_windows: int = 3
    recovery_deadline_s: int = 300
    request_timeout_s: int = 60  # a request without an answer by then counts as hung
    rss_growth_limit_mb: float = 64.0  # per worker, from after warm-up to the end of the soak
    start_deadline_s: float = START_DEADLINE_S

    def __post_init__(self) -> None:
        if self.recovery_windows < 1:
            raise SettingsError(f"recovery_windows must be >= 1, got {self.recovery_windows}")
        if not self.models:
            raise SettingsError("a soak needs at least one model to serve")
        if self.killed not in self.models:
            raise SettingsError(f"kill_model {self.killed!r} is not among the served models {list(self.models)}")

    @property
    def killed(self) -> str:
        return self.kill_model or self.models[0]


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclasses.dataclass(frozen=True)
class WorkerMemory:
    model: str
    pid: int
    start_mb: float
    end_mb: float
    peak_mb: float


@dataclasses.dataclass(frozen=True)
class SoakPhase:
    seconds: float
    requests: int
    throughput_rps: float
    non_2xx: int
    no_response: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    replaced_workers: list[str]
    memory: list[WorkerMemory]


@dataclasses.dataclass(frozen=True)
class KillPhase:
    model: str
    killed_pid: int
    replacement_pid: int
    requests: int
    failed: int  # answered with an error while the worker was down
    no_response: int  # hung or dropped: must be 0
    failures: list[str]  # "t+0.4s 500 Worker died." per failed request
    replaced_after_s: float  # kill -> replacement READY
    full_rate_after_s: float | None  # kill -> first window back at RECOVERED_FRACTION of the rate before
    rate_before: float
    rate_after: float  # the best window's
    rates_after: list[float]  # each window's after READY, up to the first back at RECOVERED_FRACTION
    replacement_cpus: list[int]
    sibling_cpus: list[int]
    killed_cpus: list[int]  # the freed slot: the replacement belongs there


@dataclasses.dataclass(frozen=True)
class RestartPhase:
    first_start_s: float
    first_new_kernels: int  # kernel libraries the first start compiled (0 on a warm cache)
    restart_s: float
    restart_new_kernels: int  # must be 0
    cached_kernels_mapped: dict[str, int]  # worker -> kernel libraries it loaded from the cache
    compiled: bool  # False when every backend is eager: nothing to cache
    answered: dict[str, int]  # model -> HTTP status of one request after the restart


@dataclasses.dataclass(frozen=True)
class SoakReport:
    settings: SoakSettings
    soak: SoakPhase
    kill: KillPhase
    restart: RestartPhase
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)


def evaluate(settings: SoakSettings, soak: SoakPhase, kill: KillPhase, restart: RestartPhase) -> list[Check]:
    growth = {f"{m.model}/{m.pid}": round(m.end_mb - m.start_mb, 1) for m in soak.memory}
    # On the killed worker's cores, none of its siblings' (a model with one worker has none).
    pinned = set(kill.replacement_cpus) == set(kill.killed_cpus) and not set(kill.replacement_cpus) & set(
        kill.sibling_cpus
    )
    return [
        Check(
            "soak: every request answered 2xx",
            soak.non_2xx == 0 and soak.no_response == 0,
            f"{soak.requests} requests, {soak.non_2xx} non-2xx, {soak.no_response} unanswered",
        ),
        Check("soak: no worker replaced", not soak.replaced_workers, f"replaced: {soak.replaced_workers or 'none'}"),
        Check(
            f"soak: worker RSS growth <= {settings.rss_growth_limit_mb:.0f} MB",
            all(g <= settings.rss_growth_limit_mb for g in growth.values()),
            f"growth MB: {growth}",
        ),
        Check(
            "kill: no request hung or dropped",
            kill.no_response == 0,
            f"{kill.failed} errors, {kill.no_response} unanswered of {kill.requests}",
        ),
        Check(
            "kill: replacement pinned to the freed core",
            pinned,
            f"replacement cpus {kill.replacement_cpus}, killed {kill.killed_cpus}, siblings {kill.sibling_cpus}",
        ),
        Check(
            f"kill: throughput back to >= {RECOVERED_FRACTION:.0%}",
            kill.rate_after >= RECOVERED_FRACTION * kill.rate_before,
            f"{kill.rate_before} req/s before, {kill.rates_after} after (windows of {settings.after_recovery_s} s); "
            f"full rate after "
            f"{kill.full_rate_after_s}s, worker READY after {kill.replaced_after_s}s",
        ),
        Check("restart: every model answers", all(s == 200 for s in restart.answered.values()), f"{restart.answered}"),
        Check(
            "restart: kernels loaded from the cache, none compiled again",
            not restart.compiled
            or (
                restart.restart_new_kernels == 0
                and bool(restart.cached_kernels_mapped)
                and all(restart.cached_kernels_mapped.values())
            ),
            f"{restart.restart_new_kernels} new kernel libraries; cached ones mapped per worker "
            f"{restart.cached_kernels_mapped}; start-to-READY {restart.restart_s}s "
            f"(first start {restart.first_start_s}s, {restart.first_new_kernels} new)",
        ),
    ]


def markdown(report: SoakReport, command: str) -> str:
    soak, kill, restart = report.soak, report.kill, report.restart
    lines = [
        f"# Soak, kill and restart: {'PASSED' if report.passed else 'FAILED'}",
        "",
        f"`{command}` — preset `{report.settings.preset}`, models {', '.join(report.settings.models)}, "
        f"concurrency {report.settings.concurrency}",
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *(f"| {c.name} | {'pass' if c.passed else '**FAIL**'} | {c.detail} |" for c in report.checks),
        "",
        f"**Soak** {soak.seconds:.0f} s: {soak.requests} requests, {soak.throughput_rps} req/s, "
        f"p50 {soak.p50_ms} ms, p99 {soak.p99_ms} ms, max {soak.max_ms} ms.",
        "",
        "| worker | pid | RSS start MB | RSS end MB | peak MB |",
        "|---|---|---|---|---|",
        *(f"| {m.model} | {m.pid} | {m.start_mb:.0f} | {m.end_mb:.0f} | {m.peak_mb:.0f} |" for m in soak.memory),
        "",
        f"**Kill** -9 of {kill.model} worker {kill.killed_pid}: replacement {kill.replacement_pid} READY after "
        f"{kill.replaced_after_s} s; full rate after {kill.full_rate_after_s} s; {kill.rate_before} req/s before, "
        f"{kill.rates_after} after (windows of {report.settings.after_recovery_s} s); {kill.failed} requests answered "
        f"with an error, {kill.no_response} unanswered, of {kill.requests}.",
        *(f"- {failure}" for failure in kill.failures[:10]),
        "",
        f"**Restart**: start-to-READY {restart.restart_s} s, {restart.restart_new_kernels} kernel libraries "
        f"compiled (first start {restart.first_start_s} s, {restart.first_new_kernels} compiled); cached kernel "
        f"libraries mapped per worker: {restart.cached_kernels_mapped}.",
    ]
    return "\n".join(lines) + "\n"
