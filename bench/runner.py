"""Run a plan: for each row start -> ready -> warm up -> ab -> collect -> stop, then in-process.

    run = BenchRun(plan, command, RunEnvironment.capture()); run_plan(run, out_dir)   # run.results, .skipped, .failed

The server of a row is always stopped (try/finally), also on Ctrl-C or SIGTERM. A row that fails
(its server does not start, ab fails, ...) is recorded with the reason and the run goes on.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
import signal
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.ab import measure_ab, warm_up
from bench.cpu_accounting import group_of
from bench.inprocess import measure_in_process, worker_cpus
from bench.metrics import requests_total, scrape, scrape_text, server_latency, worker_load_seconds
from bench.payloads import Payload, write_payload
from bench.plan import EAGER_VARIANT, Peer, Plan, Row, row_payload
from bench.results import BenchRun, InProcessResult, Measured, RowFailure, RowResult, add_derived
from bench.versus.runtimes import measure_peer
from bench.versus.served import peer_log, row_name, run_served_peer
from handlers.backends import cpu_refusal
from handlers.itt import parse_range_name
from handlers.stages import difference, summarize
from kit.footprint import measure_live
from kit.itt import Range, chrome_trace, read_ranges
from kit.models import Model
from kit.procinfo import busy_fractions, cpu_times, live_process
from kit.serve_config import ConfigError
from kit.server import ServerError, start_ready
from kit.topology import read_topology
from kit.variant import Variant


def log(message: str) -> None:
    print(f"[bench] {message}", flush=True)


def slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-").lower()


ITT_DRAIN_S = 60  # longest wait for requests ab left in flight to finish (a slow baseline: seconds)
# How long both counts must agree, unchanged, before they are taken: a request ab left unread in
# its socket is read by the frontend within it.
ITT_AGREE_S = 1.0
# How long neither count may move, disagreeing, before they are taken as they are: longer than one request.
ITT_STILL_S = 10.0
IN_PROCESS = "in-process"  # under a run's directory: what its in-process and peer rows write


def model_ranges(itt_dir: Path, model: str) -> list[Range]:
    return [r for r in read_ranges(itt_dir) if (parse_range_name(r.name) or ("",))[0] == model]


def covered(ranges: list[Range]) -> int:
    return sum(parse_range_name(r.name)[1] for r in ranges)


def settle_itt(itt_dir: Path, model: str, answered: Callable[[], int]) -> int:
    """ab stops at its time limit with requests in flight, and some still unread in its sockets:
    the frontend counts those after ab exits and the workers answer them (to nobody). Wait until
    the frontend's count and the requests the ITT ranges cover agree and stay so, so both count
    the same work; returns the frontend's count."""
    deadline = time.monotonic() + ITT_DRAIN_S
    last, since = (answered(), -1), time.monotonic()
    while time.monotonic() < deadline:
        counts = (answered(), covered(model_ranges(itt_dir, model)))
        if counts != last:
            last, since = counts, time.monotonic()
        elif time.monotonic() - since > (ITT_AGREE_S if counts[0] == counts[1] else ITT_STILL_S):
            break  # agreed long enough; or neither moves, and the report says they disagree
        time.sleep(0.2)
    return last[0]


def itt_counts(itt_dir: Path, model: str) -> tuple[int, int]:
    """(ranges, requests they cover) of the model's inference calls; their timeline beside the records."""
    ranges = model_ranges(itt_dir, model)
    (itt_dir.parent / f"{itt_dir.name}.trace.json").write_text(json.dumps(chrome_trace(ranges)))
    return len(ranges), covered(ranges)


def row_dir(out_dir: Path, row: Row) -> Path:
    return out_dir / "servers" / slug(row.label)


def run_row(row: Row, plan: Plan, out_dir: Path, payload: Payload) -> RowResult:
    itt_dir = out_dir / "itt" / slug(row.label)
    itt = row.records_itt(plan.run)
    serve = dataclasses.replace(row.serve, itt_trace_dir=str(itt_dir)) if itt else row.serve
    server = start_ready(
        serve,
        row_dir(out_dir, row),
        plan.run.start_deadline_s,
        progress=lambda m: log(f"  {m.removeprefix('[serve] ')}"),
    )
    try:
        ready_s = time.monotonic() - server.started_at
        metrics_url = server.api.url("metrics", "/metrics")
        url = server.api.url("inference", f"/predictions/{row.model}")
        warm_up(url, server.api.headers("inference"), payload, row.concurrency, plan.run)
        before, cpu_before, stages_before = scrape(metrics_url), cpu_times(), server.stage_times().get(row.model)
        result, argv, cpu_ms = measure_ab(
            url,
            server.api.headers("inference"),
            payload,
            row.concurrency,
            plan.run.seconds,
            server.process_tree,
            lambda process: group_of(process, row.model),
        )
        load_s = worker_load_seconds(scrape_text(metrics_url), row.model)
        after = scrape(metrics_url)
        latency = server_latency(before, after, row.model)
        busy = busy_fractions(cpu_before, cpu_times())
        answered = requests_total(after, row.model)
        stages = difference(server.stage_times().get(row.model, {}), stages_before)
        if itt:
            answered = settle_itt(itt_dir, row.model, lambda: requests_total(scrape(metrics_url), row.model))
        workers = [w for w in server.api.workers() if w.process]
        pss_mb = [round(f.pss / 2**20, 1) for f in map(measure_live, (w.process.pid for w in workers)) if f]
        launcher_rss_mb = sum(info.rss_mb for info in map(live_process, server.launcher_pids()) if info)
    finally:
        server.stop()
    itt_ranges, itt_requests = itt_counts(itt_dir, row.model) if itt else (None, None)
    config = server.config
    planned = server.layout.models[row.model].workers if server.layout else None
    return RowResult(
        model=row.model,
        name=row.name,
        kind="served",
        variant=config.variant.name,
        runtime=config.variant.backend.value,
        precompiled=config.variant.traits.precompiled,
        precision=config.variant.dtype.value,
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
        payload=payload.name,
        baseline=row.baseline,
        **dataclasses.asdict(result),
        items_per_s=result.requests_per_s,
        start_to_ready_s=round(ready_s, 1),
        ts_inference_ms=latency.inference_ms if latency else None,
        ts_queue_ms=latency.queue_ms if latency else None,
        allocator_loaded=[w.process.allocator for w in workers],
        cpu_affinity=[list(w.process.cpus) for w in workers],
        worker_rss_mb=[round(w.process.rss_mb, 1) for w in workers],
        worker_pss_mb=pss_mb,
        launcher_rss_mb=round(launcher_rss_mb, 1),
        worker_count=len(workers),
        ab_command=" ".join(argv),
        worker_load_s=load_s,
        cpu_busy={str(cpu): round(fraction, 3) for cpu, fraction in sorted(busy.items())},
        cpu_ms_per_request=cpu_ms,
        itt_ranges=itt_ranges,
        itt_requests=itt_requests,
        requests_answered=answered,
        stages={stage.value: dataclasses.asdict(s) for stage, s in summarize(stages).items()},
    )


def in_process_key(row: Row) -> tuple[Any, ...]:
    c = row.serve
    return (
        row.model,
        c.variant,
        c.placement,
        c.objective,
        c.cpus,
        c.workers,
        c.threads,
        c.allocator,
        c.omp_wait_policy,
        c.batch_size,
    )


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def missing_environment(row: Row) -> str:
    """Why this row cannot run here ("" if it can): its variant's venv is not built, this CPU does
    not serve its dtype, or its CPUs are not among those this process may use."""
    variant = row.serve.variant_of(row.model)
    if not (variant.environment / "bin" / "torchserve").is_file():
        return f"{variant.environment.name} is not built (`make install-ipex`)"
    if refusal := variant.refusal():
        return refusal
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
        precision=config.variant.dtype.value,
        batch_size=config.batch_size,
        workers=len(workers),
        threads=max(threads for _, threads in workers),
        **dataclasses.asdict(measured),
    )


def peer_row(model: str, peer: Peer, measured: Measured) -> InProcessResult:
    cores = read_topology().capacity  # the peer runs on every core the bench may use (CPU set and quota)
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


def skip(run: BenchRun, label: str, reason: str, progress: str = "") -> None:
    """A row or peer this machine cannot run: logged now, listed with the reason in the report."""
    log(f"{progress}{label}: skipped, {reason}")
    run.skipped.append(f"{label}: {reason}")


def run_peers(plan: Plan, out_dir: Path, run: BenchRun) -> None:
    for model in plan.run.models:
        archive = Variant.load(EAGER_VARIANT).archive(model)  # the same weights as every row
        for peer in plan.peers:
            if refusal := cpu_refusal(peer.precision):
                skip(run, f"peer {model} / {peer.name}", refusal)
                continue
            log(f"peer {model} / {peer.name}: in-process, {plan.run.in_process_seconds}s")
            measured = measure_peer(peer, archive, plan.run.in_process_seconds, out_dir / IN_PROCESS)
            log(f"  {measured.items_per_s:.1f} items/s, cosine >= {measured.cosine_min:.4f}")
            run.references.append(peer_row(model, peer, measured))


def record(run: BenchRun, failure: RowFailure, measure: Callable[[], RowResult]) -> None:
    """Measure one row into run.results; a row that raises goes to run.failed (`failure` filled
    with the reason) and the run goes on. Ctrl-C and SIGTERM still stop the run."""
    try:
        result = measure()
    except Exception as error:  # noqa: BLE001 - any failure of one row is that row's, never the run's
        message = str(error).strip() or "(no message)"
        failure = dataclasses.replace(failure, reason=f"{type(error).__name__}: {message.splitlines()[0]}")
        details = message if isinstance(error, ServerError) else traceback.format_exc()  # a bug: where
        log(f"  FAILED: {failure.reason}\n{details}\n  log: {failure.log}; going on with the next row")
        run.failed.append(failure)
        return
    log(
        f"  {result.requests_per_s:.1f} req/s, p50 {result.p50_ms:.0f} ms, p99 {result.p99_ms:.0f} ms, "
        f"non-2xx {result.non_2xx}, allocator {sorted(set(result.allocator_loaded)) or '-'}, "
        f"worker load {result.worker_load_s} s"
    )
    run.results.append(result)


def run_served_peers(plan: Plan, out_dir: Path, run: BenchRun) -> None:
    for model in plan.run.models:
        for peer in plan.served_peers:
            if refusal := Variant.load(peer.variant).refusal():
                skip(run, f"served peer {model} / {peer.name}", refusal)
                continue
            name = row_payload(f"served peer {peer.name}", model, peer.payload)
            payload = write_payload(name, Model.load(model), out_dir / "payloads")
            log(f"served peer {model} / {peer.name}: start, warm up, ab {plan.run.seconds}s")
            log_path = peer_log(peer, model, plan.run, out_dir)
            failure = RowFailure(model, row_name(peer, plan.run), "served_peer", False, "", str(log_path))
            record(run, failure, functools.partial(run_served_peer, peer, model, payload, plan.run, out_dir))


def measure_row(
    row: Row, plan: Plan, out_dir: Path, in_process: dict[tuple[Any, ...], Measured], run: BenchRun
) -> RowResult:
    """The served row, and (once per model and layout) the same archive in-process beside it."""
    result = run_row(row, plan, out_dir, write_payload(row.payload, Model.load(row.model), out_dir / "payloads"))
    if plan.run.in_process:
        key = in_process_key(row)
        if key not in in_process:
            log(f"  in-process: same model and layout without a server, {plan.run.in_process_seconds}s")
            in_process[key] = measure_in_process(
                row.serve.variant.archive(row.model),
                row.model,
                row.serve,
                plan.run.in_process_seconds,
                out_dir / IN_PROCESS,
            )
            log(f"  in-process {in_process[key].items_per_s:.1f} items/s")
            run.references.append(in_process_row(row, in_process[key]))
        measured = in_process[key]
        result.in_process_items_per_s = measured.items_per_s
        result.cosine_mean, result.cosine_min = measured.cosine_mean, measured.cosine_min
        result.top1_agreement = measured.top1_agreement
    return result


def run_plan(run: BenchRun, out_dir: Path) -> None:
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # `kill` stops cleanly like Ctrl-C
    plan = run.plan
    in_process: dict[tuple[Any, ...], Measured] = {}
    try:
        for index, row in enumerate(plan.rows, start=1):
            if reason := missing_environment(row):
                skip(run, row.label, reason, progress=f"[{index}/{len(plan.rows)}] ")
                continue
            log(
                f"[{index}/{len(plan.rows)}] {row.label}: start, wait for READY, warm up, ab {plan.run.seconds}s "
                f"at concurrency {row.concurrency}"
            )
            failure = RowFailure(row.model, row.name, "served", row.baseline, "", str(row_dir(out_dir, row)))
            record(run, failure, functools.partial(measure_row, row, plan, out_dir, in_process, run))
        run_served_peers(plan, out_dir, run)
        run_peers(plan, out_dir, run)
    finally:
        signal.signal(signal.SIGTERM, previous)
        # What the in-process and peer rows wrote (their logs, a peer's ONNX or IR copy of the
        # model): up to GBs per run, needed by no report.
        shutil.rmtree(out_dir / IN_PROCESS, ignore_errors=True)
        add_derived(run.results)
