"""Soak, worker kill and restart on a real server: `make soak` (SOAK_SECONDS=300).

    .venv/bin/python -m bench.soak.run --seconds 300                     # the full check
    .venv/bin/python -m bench.soak.run --seconds 10 --models resnet50    # what the e2e test runs

1. soak: closed-loop load at concurrency 8 over every model: no non-2xx, no worker
   replaced, worker RSS growth bounded (start/end/peak per worker).
2. kill: `kill -9` of one worker under load: every request still gets an answer (errors
   while it is down, never a hang); TorchServe replaces the worker, which is pinned to the
   core it freed, and throughput comes back; the recovery time is measured.
3. restart: stop, start again: every model answers, no kernel is compiled again (no new
   library in the compile cache) and every worker runs kernels loaded from that cache
   (mapped in /proc/PID/maps).

Writes soak.json and soak.md to bench/results/soak-<time>/ and exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import requests

from bench.payloads import body_for
from bench.results import RESULTS
from bench.soak.load import NO_RESPONSE, ClosedLoop, Request, Sample, send
from bench.soak.report import (
    RECOVERED_FRACTION,
    KillPhase,
    RestartPhase,
    SoakPhase,
    SoakReport,
    SoakSettings,
    WorkerMemory,
    evaluate,
    markdown,
)
from handlers.typed_config import SettingsError, parse_settings
from kit.models import Model
from kit.paths import INDUCTOR_CACHE
from kit.procinfo import mapped_files
from kit.serve_config import ServeConfig
from kit.server import Server, ServerError, start_ready
from kit.server_api import WorkerStatus

WINDOW_S = 2.0  # throughput window for the recovery time
READY_LINE = re.compile(r"ready: backend=(\w+) ")


def request_mix(models: tuple[str, ...]) -> list[Request]:
    bodies = {m: body_for(Model.load(m)) for m in models}
    return [Request(m, bodies[m].data, bodies[m].content_type) for m in models]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def worker_pids(workers: list[WorkerStatus]) -> dict[str, int]:
    return {f"{w.model}/{w.worker_id}": w.process.pid for w in workers if w.process}


def served_backends(model_log: Path) -> set[str]:
    """Backends named in the workers' ready lines."""
    text = model_log.read_text(errors="replace") if model_log.is_file() else ""
    return {match[1] for match in READY_LINE.finditer(text)}


def kernel_libraries() -> set[Path]:
    """Compiled kernel libraries in the servers' Inductor cache (the .so files a worker dlopens)."""
    return set(INDUCTOR_CACHE.rglob("*.so"))


# -- phases -------------------------------------------------------------------------------
def soak_phase(server: Server, settings: SoakSettings, progress: Callable[[str], None]) -> SoakPhase:
    mix = request_mix(settings.models)
    with requests.Session() as session:
        for request in mix:  # the first request per model may still be slower
            send(session, server, request)
    before = server.api.workers()
    start = time.monotonic()
    with ClosedLoop(server, mix, settings.concurrency, settings.request_timeout_s) as load:
        while (elapsed := time.monotonic() - start) < settings.seconds:
            time.sleep(min(30.0, settings.seconds - elapsed))
            done = len(load.samples)
            progress(f"[soak] {time.monotonic() - start:4.0f}s/{settings.seconds}s {done} requests")
    seconds = time.monotonic() - start
    after = server.api.workers()
    samples = load.samples
    latencies = [(s.end - s.start) * 1000 for s in samples]
    start_pids, end_pids = worker_pids(before), worker_pids(after)
    memory = [
        WorkerMemory(
            w.model,
            w.process.pid,
            round(w.process.rss_mb, 1),
            round(a.process.rss_mb, 1),
            round(a.process.peak_rss_mb, 1),
        )
        for w in before
        for a in after
        if w.process and a.process and a.process.pid == w.process.pid
    ]
    return SoakPhase(
        seconds=round(seconds, 1),
        requests=len(samples),
        throughput_rps=round(len(samples) / seconds, 2),
        non_2xx=sum(1 for s in samples if s.status not in (200, NO_RESPONSE)),
        no_response=sum(1 for s in samples if s.status == NO_RESPONSE),
        p50_ms=round(percentile(latencies, 0.50), 1),
        p99_ms=round(percentile(latencies, 0.99), 1),
        max_ms=round(max(latencies, default=0.0), 1),
        replaced_workers=sorted(k for k in start_pids if end_pids.get(k) != start_pids[k]),
        memory=memory,
    )


def wait_for_replacement(
    server: Server, model: str, killed_pid: int, expected: int, deadline_s: float
) -> list[WorkerStatus]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        workers = [w for w in server.api.workers() if w.model == model]
        pids = [w.process.pid for w in workers if w.process]
        if len(pids) == expected and killed_pid not in pids and all(w.status == "READY" for w in workers):
            return workers
        time.sleep(0.25)
    raise ServerError(f"{model}: worker {killed_pid} not replaced within {deadline_s}s; see {server.logs.frontend_log}")


def steady_rate(samples: list[Sample], start: float, end: float) -> float:
    """Requests answered a second from WINDOW_S after `start` to `end`: the first seconds are a
    ramp (the load's first requests, or a new worker's), left out before the kill and after the
    replacement alike, so that the two rates compare like with like."""
    begin = start + WINDOW_S
    return sum(1 for s in samples if begin <= s.end < end) / (end - begin)


def full_rate_after(samples: list[Sample], killed_at: float, end: float, rate_before: float) -> float | None:
    """Seconds from the kill to the first WINDOW_S window back at RECOVERED_FRACTION of the rate."""
    t = killed_at + WINDOW_S  # the first window is the one right after the kill
    while t + WINDOW_S <= end:
        if sum(1 for s in samples if t <= s.end < t + WINDOW_S) / WINDOW_S >= RECOVERED_FRACTION * rate_before:
            return round(t - killed_at, 1)
        t += 0.5
    return None


def recovered_rates(
    samples: Callable[[], list[Sample]],
    replaced_at: float,
    rate_before: float,
    settings: SoakSettings,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[float], float]:
    """The rate of each window of after_recovery_s from READY on, until one is back at
    RECOVERED_FRACTION of the rate before (at most recovery_windows of them); and the last one's end."""
    rates: list[float] = []
    start = end = replaced_at
    while len(rates) < settings.recovery_windows:
        sleep(settings.after_recovery_s)
        end = clock()
        rates.append(round(steady_rate(samples(), start, end), 2))
        if rates[-1] >= RECOVERED_FRACTION * rate_before:
            break
        start = end
    return rates, end


def kill_phase(server: Server, settings: SoakSettings, progress: Callable[[str], None]) -> KillPhase:
    model = settings.killed
    workers = [w for w in server.api.workers() if w.model == model and w.process]
    victim, siblings = workers[0], workers[1:]
    mix = [r for r in request_mix(settings.models) if r.model == model]
    with ClosedLoop(server, mix, settings.concurrency, settings.request_timeout_s) as load:
        time.sleep(settings.before_kill_s)
        killed_at = time.monotonic()
        progress(f"[soak] kill -9 {model} worker pid {victim.process.pid} under load")
        os.kill(victim.process.pid, signal.SIGKILL)
        replaced = wait_for_replacement(server, model, victim.process.pid, len(workers), settings.recovery_deadline_s)
        replaced_at = time.monotonic()
        progress(f"[soak] replacement READY after {replaced_at - killed_at:.1f}s")
        rate_before = steady_rate(list(load.samples), killed_at - settings.before_kill_s, killed_at)
        rates_after, end = recovered_rates(lambda: list(load.samples), replaced_at, rate_before, settings)
    samples = load.samples
    sibling_pids = {w.process.pid for w in siblings}
    replacement = next(w for w in replaced if w.process.pid not in sibling_pids)
    failed = [s for s in samples if not s.ok]
    return KillPhase(
        model=model,
        killed_pid=victim.process.pid,
        replacement_pid=replacement.process.pid,
        requests=len(samples),
        failed=sum(1 for s in failed if s.status != NO_RESPONSE),
        no_response=sum(1 for s in failed if s.status == NO_RESPONSE),
        failures=[f"t{s.end - killed_at:+.1f}s {s.status} {' '.join(s.error.split())[:120]}" for s in failed],
        replaced_after_s=round(replaced_at - killed_at, 1),
        full_rate_after_s=full_rate_after(samples, killed_at, end, rate_before),
        rate_before=round(rate_before, 2),
        rate_after=max(rates_after),
        rates_after=rates_after,
        replacement_cpus=list(replacement.process.cpus),
        sibling_cpus=sorted({c for w in siblings for c in w.process.cpus}),
        killed_cpus=list(victim.process.cpus),
    )


def restart_phase(
    config: ServeConfig, out_dir: Path, first_start_s: float, first_new_kernels: int, settings: SoakSettings
) -> RestartPhase:
    kernels_before = kernel_libraries()
    server = start_ready(config, out_dir / "restart", settings.start_deadline_s)
    try:
        restart_s = time.monotonic() - server.started_at
        with requests.Session() as session:
            answered = {r.model: send(session, server, r).status for r in request_mix(settings.models)}
        mapped = {
            f"{w.model}/{w.worker_id}": len(mapped_files(w.process.pid, INDUCTOR_CACHE))
            for w in server.api.workers()
            if w.process
        }
    finally:
        server.stop()
    return RestartPhase(
        first_start_s=round(first_start_s, 1),
        first_new_kernels=first_new_kernels,
        restart_s=round(restart_s, 1),
        restart_new_kernels=len(kernel_libraries() - kernels_before),
        cached_kernels_mapped=mapped,
        compiled=served_backends(server.logs.model_log) != {"eager"},
        answered=answered,
    )


def run_soak(settings: SoakSettings, out_dir: Path, progress: Callable[[str], None] = print) -> SoakReport:
    config = ServeConfig.from_preset(settings.preset, models=list(settings.models))
    kernels_before = kernel_libraries()
    first = start_ready(config, out_dir / "server", settings.start_deadline_s, progress)
    try:
        first_start_s = time.monotonic() - first.started_at
        first_new_kernels = len(kernel_libraries() - kernels_before)
        progress(f"[soak] {settings.seconds}s at concurrency {settings.concurrency} over {list(settings.models)}")
        soak = soak_phase(first, settings, progress)
        kill = kill_phase(first, settings, progress)
    finally:
        first.stop()
    progress("[soak] stopped; starting again to check the warm compile cache")
    restart = restart_phase(config, out_dir, first_start_s, first_new_kernels, settings)
    return SoakReport(settings, soak, kill, restart, evaluate(settings, soak, kill, restart))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=SoakSettings.seconds)
    parser.add_argument("--models", default="", help="comma list (default: every model in config/models)")
    parser.add_argument("--preset", default=SoakSettings.preset)
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/soak-<time>")
    args = parser.parse_args(argv)
    given = {"seconds": args.seconds, "preset": args.preset}
    try:
        settings = parse_settings(
            SoakSettings, {**given, **({"models": args.models.split(",")} if args.models else {})}
        )
    except SettingsError as error:
        print(f"[soak] ERROR: {error}", file=sys.stderr)
        return 2
    out_dir = args.out or RESULTS / time.strftime("soak-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        report = run_soak(settings, out_dir)
    except ServerError as error:
        print(f"[soak] ERROR: {error}", file=sys.stderr)
        return 1
    command = "python -m bench.soak.run " + " ".join(argv if argv is not None else sys.argv[1:])
    (out_dir / "soak.json").write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    (out_dir / "soak.md").write_text(markdown(report, command))
    print((out_dir / "soak.md").read_text())
    print(f"[soak] report: {out_dir / 'soak.md'}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
