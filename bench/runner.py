"""Run a plan: for each row start -> ready -> warm up -> ab -> collect -> stop, then in-process.

    run = BenchRun(plan, command, RunEnvironment.capture()); run_plan(run, out_dir)   # run.results, run.skipped

The server of a row is always stopped (try/finally), also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.ab import MAX_REQUESTS, AbResult, ab_command, parse_ab
from bench.cpu_accounting import children_cpu_s, per_request_ms, snapshot
from bench.inprocess import measure_in_process, worker_cpus
from bench.metrics import scrape, scrape_text, server_latency, worker_load_seconds
from bench.payloads import Payload, payload_for
from bench.peers import measure_peer
from bench.plan import EAGER_VARIANT, Peer, Plan, Row
from bench.results import PRECISION_OF_DTYPE, BenchRun, InProcessResult, Measured, RowResult, add_derived
from kit.procinfo import busy_fractions, cpu_times, live_process
from kit.serve_config import ConfigError, free_ports_config
from kit.server import Server
from kit.variant import Variant


def log(message: str) -> None:
    print(f"[bench] {message}", flush=True)


def slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-").lower()


def run_ab(
    server: Server, row: Row, payload: Payload, seconds: int, requests: int = MAX_REQUESTS
) -> tuple[AbResult, list[str]]:
    argv = ab_command(
        server.url("inference", f"/predictions/{row.model}"),
        payload.path,
        payload.content_type,
        seconds=seconds,
        concurrency=row.concurrency,
        headers=server.headers("inference"),
        requests=requests,
    )
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 600)
    if completed.returncode != 0:
        raise RuntimeError(f"ab failed ({completed.returncode}): {completed.stderr.strip()[-500:]}")
    return parse_ab(completed.stdout), argv


def run_row(row: Row, plan: Plan, out_dir: Path, payload: Payload) -> RowResult:
    server = Server(free_ports_config(row.serve), out_dir / "servers" / slug(row.label))
    try:
        start = time.monotonic()
        server.start()
        server.wait_ready(plan.run.start_deadline_s, progress=lambda m: log(f"  {m.removeprefix('[serve] ')}"))
        ready_s = time.monotonic() - start
        if plan.run.warmup_requests:
            # ab refuses fewer requests than its concurrency.
            run_ab(server, row, payload, seconds=120, requests=max(plan.run.warmup_requests, row.concurrency))
        metrics_url = server.url("metrics", "/metrics")
        load_s = worker_load_seconds(scrape_text(metrics_url), row.model)
        before, cpu_before = scrape(metrics_url), cpu_times()
        groups_before, ab_before = snapshot(server, row.model), children_cpu_s()
        result, argv = run_ab(server, row, payload, plan.run.seconds)
        cpu_ms = per_request_ms(
            groups_before, snapshot(server, row.model), children_cpu_s() - ab_before, result.complete
        )
        latency = server_latency(before, scrape(metrics_url), row.model)
        busy = busy_fractions(cpu_before, cpu_times())
        workers = [w for w in server.workers() if w.process]
        launcher_rss_mb = sum(info.rss_mb for info in map(live_process, server.launcher_pids()) if info)
    finally:
        server.stop()
    config = server.config
    planned = server.layout.models[row.model].workers if server.layout else None
    return RowResult(
        model=row.model,
        name=row.name,
        kind="served",
        variant=config.variant.name,
        runtime=config.variant.backend.value,
        precompiled=config.variant.traits.precompiled,
        precision=PRECISION_OF_DTYPE[config.variant.dtype].value,
        placement=config.placement.value,
        objective=config.objective.value,
        allocator=config.served_allocator.value,
        omp_wait_policy=config.omp_wait_policy.value,
        workers=len(planned) if planned else config.workers,
        threads=max(w.threads for w in planned) if planned else config.threads,
        cpus=config.cpus,
        batch_size=config.batch_size,
        max_batch_delay_ms=config.max_batch_delay_ms,
        concurrency=row.concurrency,
        baseline=row.baseline,
        **dataclasses.asdict(result),
        items_per_s=result.requests_per_s,
        start_to_ready_s=round(ready_s, 1),
        ts_inference_ms=latency.inference_ms if latency else None,
        ts_queue_ms=latency.queue_ms if latency else None,
        allocator_loaded=[w.process.allocator for w in workers],
        cpu_affinity=[list(w.process.cpus) for w in workers],
        worker_rss_mb=[round(w.process.rss_mb, 1) for w in workers],
        launcher_rss_mb=round(launcher_rss_mb, 1),
        worker_count=len(workers),
        ab_command=" ".join(argv),
        worker_load_s=load_s,
        cpu_busy={str(cpu): round(fraction, 3) for cpu, fraction in sorted(busy.items())},
        cpu_ms_per_request=cpu_ms,
    )


def in_process_key(row: Row) -> tuple[Any, ...]:
    c = row.serve
    return (row.model, c.variant, c.placement, c.objective, c.cpus, c.workers, c.threads, c.allocator,
            c.omp_wait_policy, c.batch_size)  # fmt: skip


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def missing_environment(row: Row) -> str:
    """Why this row cannot run here ("" if it can): its variant's venv is not built, or its CPUs
    are not among those this process may use."""
    venv = row.serve.variant.environment
    if not (venv / "bin" / "torchserve").is_file():
        return f"{venv.name} is not built (`make install-ipex`)"
    try:
        row.serve.allowed_cpus  # noqa: B018 - raises when the row's cpus are not usable here
    except ConfigError as error:
        return str(error)
    return ""


def in_process_row(row: Row, measured: Measured) -> InProcessResult:
    config = row.serve
    workers = worker_cpus(config, row.model)
    return InProcessResult(
        model=row.model,
        name=f"{config.variant.name} {len(workers)}x{max(t for _, t in workers)} b{config.batch_size}",
        kind="in_process",
        runtime=config.variant.backend.value,
        precision=PRECISION_OF_DTYPE[config.variant.dtype].value,
        batch_size=config.batch_size,
        workers=len(workers),
        threads=max(threads for _, threads in workers),
        **dataclasses.asdict(measured),
    )


def peer_row(model: str, peer: Peer, measured: Measured) -> InProcessResult:
    cores = len(os.sched_getaffinity(0))  # the peer runs on every CPU the bench may use
    return InProcessResult(
        model=model,
        name=peer.name,
        kind="peer",
        runtime=peer.runtime.value,
        precision=peer.precision.value,
        batch_size=peer.batch_size,
        workers=1,
        threads=cores,
        **dataclasses.asdict(measured),
    )


def run_peers(plan: Plan, out_dir: Path, run: BenchRun) -> None:
    for model in plan.run.models:
        archive = Variant.load(EAGER_VARIANT).archive(model)  # the same weights as every row
        for peer in plan.peers:
            log(f"peer {model} / {peer.name}: in-process, {plan.run.in_process_seconds}s")
            measured = measure_peer(peer, archive, plan.run.in_process_seconds, out_dir / "extracted")
            log(f"  {measured.items_per_s:.1f} items/s, cosine >= {measured.cosine_min:.4f}")
            run.references.append(peer_row(model, peer, measured))


def run_plan(run: BenchRun, out_dir: Path) -> None:
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # `kill` stops cleanly like Ctrl-C
    plan, results = run.plan, run.results
    in_process: dict[tuple[Any, ...], Measured] = {}
    try:
        for index, row in enumerate(plan.rows, start=1):
            if reason := missing_environment(row):
                log(f"[{index}/{len(plan.rows)}] {row.label}: skipped, {reason}")
                run.skipped.append(f"{row.label}: {reason}")
                continue
            log(f"[{index}/{len(plan.rows)}] {row.label}: start, wait for READY, warm up, ab {plan.run.seconds}s "
                f"at concurrency {row.concurrency}")  # fmt: skip
            result = run_row(row, plan, out_dir, payload_for(row.model, out_dir))
            log(f"  {result.requests_per_s:.1f} req/s, p50 {result.p50_ms:.0f} ms, p99 {result.p99_ms:.0f} ms, "
                f"non-2xx {result.non_2xx}, allocator {sorted(set(result.allocator_loaded))}, "
                f"worker load {result.worker_load_s} s")  # fmt: skip
            if plan.run.in_process:
                key = in_process_key(row)
                if key not in in_process:
                    log(f"  in-process: same model and layout without a server, {plan.run.in_process_seconds}s")
                    in_process[key] = measure_in_process(
                        row.serve.variant.archive(row.model),
                        row.model,
                        row.serve,
                        plan.run.in_process_seconds,
                        out_dir / "extracted",
                    )
                    log(f"  in-process {in_process[key].items_per_s:.1f} items/s")
                    run.references.append(in_process_row(row, in_process[key]))
                measured = in_process[key]
                result.in_process_items_per_s = measured.items_per_s
                result.cosine_mean, result.cosine_min = measured.cosine_mean, measured.cosine_min
                result.top1_agreement = measured.top1_agreement
            results.append(result)
        run_peers(plan, out_dir, run)
    finally:
        signal.signal(signal.SIGTERM, previous)
        # Archives unpacked for the in-process and peer rows: GBs per run, needed by no report.
        shutil.rmtree(out_dir / "extracted", ignore_errors=True)
        add_derived(results)
