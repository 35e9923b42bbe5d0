"""Write a bench run: results.json (machine-readable), report.md (tables + targets), throughput.png.

write_report(out_dir, run)   # run: bench.results.BenchRun

One module, because every table, target check and chart reads the same records (bench/results.py)
and writes into the one report; the comparison with peers has its own (bench/versus/report.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from bench.payloads import default_payload
from bench.results import BenchRun, InProcessResult, RowResult
from handlers.backends import DType
from kit.models import Model

# Per-model targets (speedup, int8 agreement) are in the model files: kit/models.py Targets.
SERVED_VS_IN_PROCESS_TARGET = 0.90
# A new worker of a precompiled backend (nothing compiles in the worker) is READY within this.
COLD_START_TARGET_S = 5.0


@dataclasses.dataclass(frozen=True)
class TargetCheck:
    target: str
    measured: str
    met: bool


def comparable(results: list[RowResult], model: str, kind: str = "served") -> list[RowResult]:
    """The model's error-free rows of `kind` on its default payload: what targets compare."""
    payload = default_payload(Model.load(model))
    return [
        r
        for r in results
        if r.model == model and r.kind == kind and r.payload == payload and r.non_2xx == 0 and r.failed == 0
    ]


def best_row(results: list[RowResult], model: str) -> RowResult | None:
    return max(comparable(results, model), key=lambda r: r.requests_per_s, default=None)


def _short_by(measured: float, target: float) -> str:
    return "" if measured >= target else f", short by {(target - measured) / target:.0%}"


def _versus(model: str, what: str, mine: list, theirs: list) -> list[TargetCheck]:
    """Best of `mine` >= best of `theirs`, in each precision both have and in any precision."""
    checks = []
    for precision in [*sorted({r.precision for r in theirs}), None]:  # None: any precision
        ours = [r for r in mine if precision in (None, r.precision)]
        others = [r for r in theirs if precision in (None, r.precision)]
        if not ours or not others:
            continue
        best = max(ours, key=lambda r: r.items_per_s)
        peer = max(others, key=lambda r: r.items_per_s)
        checks.append(
            TargetCheck(
                f"{model} {precision or 'any precision'}: best served row >= best {what}",
                f"{best.items_per_s:.1f} ({best.name}) vs {peer.items_per_s:.1f} ({peer.name}): "
                f"{best.items_per_s / peer.items_per_s:.0%}" + _short_by(best.items_per_s, peer.items_per_s),
                best.items_per_s >= peer.items_per_s,
            )
        )
    return checks


def peer_checks(results: list[RowResult], references: list[InProcessResult]) -> list[TargetCheck]:
    """The kit's best served row against the best served peer (same payload, same ab) and the best
    in-process peer, per model and precision."""
    checks = []
    for model in dict.fromkeys(r.model for r in [*results, *references]):
        mine = comparable(results, model)
        checks += _versus(model, "served peer row", mine, comparable(results, model, "served_peer"))
        in_process = [r for r in references if r.model == model and r.kind == "peer"]
        checks += _versus(model, "in-process peer row", mine, in_process)
    return checks


def accuracy_checks(references: list[InProcessResult]) -> list[TargetCheck]:
    checks = []
    for r in (r for r in references if r.precision == DType.INT8):
        targets = Model.load(r.model).targets
        minimums = {"top1_agreement": targets.int8_top1_agreement, "cosine_mean": targets.int8_cosine_mean}
        for metric, minimum in ((m, v) for m, v in minimums.items() if v is not None):
            value = getattr(r, metric)
            checks.append(
                TargetCheck(
                    f"{r.model} int8 {metric} >= {minimum} ({r.kind} {r.name})", f"{value:.4f}", value >= minimum
                )
            )
    return checks


# Issue 25: a short text (16 tokens) served at least this much faster than a 128-token one, on
# the same variant and layout: padding to the length bucket, not to max_length.
SHORT_VS_TYPICAL_TARGET = 3.0


def length_checks(results: list[RowResult]) -> list[TargetCheck]:
    """Each served text configuration measured with both payloads: short against typical req/s."""

    def setup(r: RowResult) -> tuple:
        return (r.model, r.variant, r.placement, r.workers, r.threads, r.batch_size, r.concurrency, r.cpus)

    served = [r for r in results if r.kind == "served"]
    typical = {setup(r): r for r in served if r.payload == "typical"}
    checks = []
    for short in (r for r in served if r.payload == "short" and setup(r) in typical):
        ratio = short.requests_per_s / typical[setup(short)].requests_per_s
        checks.append(
            TargetCheck(
                f"{short.model} {short.variant}: short payload >= {SHORT_VS_TYPICAL_TARGET:.1f}x typical req/s",
                f"{ratio:.2f}x ({short.requests_per_s:.1f} vs {typical[setup(short)].requests_per_s:.1f})",
                ratio >= SHORT_VS_TYPICAL_TARGET,
            )
        )
    return checks


def cold_start_checks(results: list[RowResult]) -> list[TargetCheck]:
    checks = []
    for r in results:
        if r.precompiled and r.worker_load_s is not None:
            checks.append(
                TargetCheck(
                    f"{r.model} / {r.name}: worker spawn-to-READY <= {COLD_START_TARGET_S:.0f} s",
                    f"{r.worker_load_s:.1f} s",
                    r.worker_load_s <= COLD_START_TARGET_S,
                )
            )
    return checks


def check_targets(results: list[RowResult], references: list[InProcessResult] = ()) -> list[TargetCheck]:
    checks = []
    for model in sorted({r.model for r in results}):
        target, best = Model.load(model).targets.speedup, best_row(results, model)
        if target is None or best is None or best.speedup_vs_baseline is None:
            continue
        checks.append(
            TargetCheck(
                f"{model}: best row >= {target:.1f}x baseline req/s",
                f"{best.speedup_vs_baseline:.2f}x ({best.name})"
                + (
                    "" if best.speedup_vs_baseline >= target else f", short by {target - best.speedup_vs_baseline:.2f}x"
                ),
                best.speedup_vs_baseline >= target,
            )
        )
    for model in sorted({r.model for r in results}):
        best = best_row(results, model)
        if best is None or best.served_vs_in_process is None:
            continue
        ratio = best.served_vs_in_process
        checks.append(
            TargetCheck(
                f"{model}: best row served >= {SERVED_VS_IN_PROCESS_TARGET:.0%} of in-process",
                f"{ratio:.0%} ({best.items_per_s:.1f} vs {best.in_process_items_per_s:.1f} items/s)"
                + (
                    ""
                    if ratio >= SERVED_VS_IN_PROCESS_TARGET
                    else f", short by {SERVED_VS_IN_PROCESS_TARGET - ratio:.0%}"
                ),
                ratio >= SERVED_VS_IN_PROCESS_TARGET,
            )
        )
    checks += peer_checks(results, list(references)) + accuracy_checks(list(references)) + cold_start_checks(results)
    checks += itt_checks(results) + length_checks(results)
    bad = [f"{r.model}/{r.name}: {r.non_2xx} non-2xx, {r.failed} failed" for r in results if r.non_2xx or r.failed]
    checks.append(TargetCheck("zero non-2xx responses in every row", "; ".join(bad) or "0 in all rows", not bad))
    return checks


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def reference_table(rows: list[InProcessResult]) -> list[str]:
    lines = [
        "| without a server | kind | runtime | precision | W×T | batch | items/s | cosine mean/min | top-1 agreement |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.kind} | {r.runtime} | {r.precision} | {r.workers}×{r.threads} | {r.batch_size} | "
            f"{r.items_per_s:.1f} | {r.cosine_mean:.4f}/{r.cosine_min:.4f} | {r.top1_agreement:.0%} |"
        )
    return lines


def cpu_table(results: list[RowResult]) -> list[str]:
    """Where a served request's CPU goes: ms per request of each process group (/proc)."""
    rows = [r for r in results if r.cpu_ms_per_request]
    if not rows:
        return []
    groups = sorted({g for r in rows for g in r.cpu_ms_per_request})
    lines = [
        "## CPU per request",
        "",
        "CPU ms per request of each process group during the ab window (utime + stime from /proc; "
        "workers = the row's model's; ab = the load generator).",
        "",
        f"| model | row | {' | '.join(groups)} | total |",
        f"|---|---|{'---|' * len(groups)}---|",
    ]
    for r in rows:
        cells = " | ".join(_fmt(r.cpu_ms_per_request.get(g)) for g in groups)
        lines.append(f"| {r.model} | {r.name} | {cells} | {sum(r.cpu_ms_per_request.values()):.1f} |")
    return [*lines, ""]


def stage_table(results: list[RowResult]) -> list[str]:
    """Where the kit's workers (and a served peer's processes) spend a call, per stage
    (handlers/stages.py): wall and CPU ms per request, p50 / p99 wall ms per call."""
    rows = [r for r in results if r.stages]
    if not rows:
        return []
    stages = list(dict.fromkeys(stage for r in rows for stage in r.stages))
    lines = [
        "## Where the workers' time goes",
        "",
        "Per stage of an inference call, during the ab window (handlers/stages.py; a served peer times its "
        "decode, model call and format the same way): mean wall ms per request, its CPU ms (wall time "
        "includes the turns of processes that preempt the stage, CPU time does not), then p50 / p99 wall ms per call.",
        "",
        f"| model | row | {' | '.join(stages)} |",
        f"|---|---|{'---|' * len(stages)}",
    ]
    for r in rows:
        cells = [r.stages.get(stage) for stage in stages]
        text = [
            f"{c['ms_per_request']:.2f}, cpu {c.get('cpu_ms_per_request', 0.0):.2f} "
            f"({c['p50_ms']:.2f} / {c['p99_ms']:.2f})"
            if c
            else "-"
            for c in cells
        ]
        lines.append(f"| {r.model} | {r.name} | {' | '.join(text)} |")
    return [*lines, ""]


def itt_table(results: list[RowResult]) -> list[str]:
    """ITT ranges the workers recorded against the requests the frontend answered, per served row."""
    rows = [r for r in results if r.itt_ranges is not None]
    if not rows:
        return []
    lines = [
        "## ITT ranges",
        "",
        "One range per inference call, recorded by the kit's collector (kit/itt.py) in every worker; a call of "
        "k requests is named `<model>:bs<k>`. Timelines: `itt/<row>.trace.json` (ui.perfetto.dev, chrome://tracing).",
        "",
        "| model | row | ranges | requests in ranges | requests answered | match |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        match = "yes" if r.itt_requests == r.requests_answered else "**no**"
        lines.append(
            f"| {r.model} | {r.name} | {r.itt_ranges} | {r.itt_requests} | {_fmt(r.requests_answered)} | {match} |"
        )
    return [*lines, ""]


def itt_checks(results: list[RowResult]) -> list[TargetCheck]:
    rows = [r for r in results if r.itt_ranges is not None]
    if not rows:
        return []
    bad = [
        f"{r.model}/{r.name}: {r.itt_requests} vs {r.requests_answered}"
        for r in rows
        if r.itt_requests != r.requests_answered
    ]
    measured = "; ".join(bad) or f"{sum(r.itt_requests for r in rows)} requests in {len(rows)} rows"
    return [TargetCheck("ITT ranges cover every answered request, in every served row", measured, not bad)]


def markdown(run: BenchRun) -> str:
    plan, env, results, references = run.plan, run.environment, run.results, run.references
    lines = [
        f"# Bench `{plan.name}`",
        "",
        f"`{run.command}` — {env.date}, {env.cpu_model}, {env.cores} cores, "
        f"torch {env.torch}, TorchServe {env.torchserve}, commit {env.git_commit}",
        "",
        f"ab -k for {plan.run.seconds}s per row after {plan.run.warmup_requests} warm-up requests; "
        "one item per request. In-process = the same model and layout without a server; peers = the same "
        "weights in another runtime, one process using every core. Cosine and top-1 agreement are against "
        "float32 eager on held-out inputs (random weights: near-tied logits make top-1 pessimistic). "
        "load s = the slowest worker's spawn-to-READY (TorchServe's WorkerLoadTime). CPU busy % = each CPU's "
        "busy share during the ab window, CPU 0 first. RSS MB: the workers' (+ the launcher processes TorchServe's "
        "CPU launcher leaves as their parents).",
        "",
        *(f"Machine: {line}" for line in env.topology),
        "",
    ]
    for model in dict.fromkeys([r.model for r in results] + [r.model for r in references]):
        lines += [
            f"## {model}",
            "",
            "| row | payload | variant | precision | placement | allocator (loaded) | W×T | batch | c | req/s | speedup | "
            "p50 ms | p90 ms | p99 ms | non-2xx | TS total/queue ms | in-process items/s | served/in-process | "
            "ready s | load s | RSS / PSS MB | CPU busy % |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in results if r.model == model):
            layout = f"{r.workers or 'def'}×{r.threads or 'def'}"
            loaded = ",".join(sorted(set(r.allocator_loaded))) or "?"
            ts = f"{_fmt(r.ts_inference_ms)}/{_fmt(r.ts_queue_ms)}"
            speedup = f"{r.speedup_vs_baseline:.2f}×" if r.speedup_vs_baseline else "–"
            ratio = f"{r.served_vs_in_process:.0%}" if r.served_vs_in_process else "–"
            name = f"**{r.name}**" if r.baseline else r.name
            lines.append(
                f"| {name} | {r.payload} | {r.variant} | {r.precision} | {r.placement}{f' cpus {r.cpus}' if r.cpus else ''} | "
                f"{r.allocator} ({loaded}) | {layout} | "
                f"{r.batch_size} | {r.concurrency} | {r.requests_per_s:.1f} | {speedup} | {r.p50_ms:.0f} | "
                f"{r.p90_ms:.0f} | {r.p99_ms:.0f} | {r.non_2xx} | {ts} | {_fmt(r.in_process_items_per_s)} | {ratio} | "
                f"{r.start_to_ready_s:.0f} | {_fmt(r.worker_load_s)} | {_fmt(sum(r.worker_rss_mb), 0)} / {_fmt(sum(r.worker_pss_mb), 0) if r.worker_pss_mb else '–'}{f' +{r.launcher_rss_mb:.0f}' if r.launcher_rss_mb else ''} | "
                f"{'/'.join(f'{100 * busy:.0f}' for busy in r.cpu_busy.values()) or '–'} |"
            )
        lines.append("")
        others = [r for r in references if r.model == model]
        if others:
            lines += [*reference_table(others), ""]
    lines += cpu_table(results) + stage_table(results) + itt_table(results)
    if run.skipped:
        lines += ["## Skipped rows", "", *(f"- {reason}" for reason in run.skipped), ""]
    if run.failed:
        lines += [
            "## Failed rows",
            "",
            "The run went on without them. The reason is the first line of the error; the log holds the rest.",
            "",
            "| model | row | reason | log |",
            "|---|---|---|---|",
        ]
        lines += [f"| {f.model} | {f.name} | {f.reason.replace('|', '/')} | `{f.log}` |" for f in run.failed]
        lines += [*(f"**Lost**: {what}" for what in run.lost()), ""]
    lines += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for check in check_targets(results, references):
        lines.append(f"| {check.target} | {check.measured} | {'yes' if check.met else '**no**'} |")
    lines.append("")
    return "\n".join(lines)


def chart(results: list[RowResult], path: Path, peers: list[InProcessResult] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.model for r in results))
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        rows = [r for r in results if r.model == model]
        others = [r for r in peers if r.model == model]
        names = [f"{r.name} ({r.precision})" for r in rows] + [f"peer: {r.name}" for r in others]
        values = [r.items_per_s for r in rows] + [r.items_per_s for r in others]
        colours = ["#888888" if r.baseline else "#1f77b4" for r in rows] + ["#ff7f0e"] * len(others)
        bars = ax.barh(names, values, color=colours)
        speedups = [r.speedup_vs_baseline for r in rows] + [None] * len(others)
        for bar, value, speedup in zip(bars, values, speedups, strict=True):
            label = f"{value:.1f}" + (f" ({speedup:.1f}×)" if speedup else "")
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {label}", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{model}: items/s (grey = baseline, orange = peer runtime in-process)")
        ax.set_xlabel("items/s")
        ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cpu_chart(results: list[RowResult], path: Path) -> None:
    """One stacked bar per served row: CPU ms per request, split by process group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if r.cpu_ms_per_request]
    groups = sorted({g for r in rows for g in r.cpu_ms_per_request})
    fig, ax = plt.subplots(figsize=(9, 1 + 0.4 * len(rows)))
    names = [f"{r.model}: {r.name}" for r in rows]
    left = [0.0] * len(rows)
    for group in groups:
        widths = [r.cpu_ms_per_request.get(group, 0.0) for r in rows]
        ax.barh(names, widths, left=left, label=group)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("CPU ms per request")
    ax.set_title("Where a served request's CPU goes (/proc, during the ab window)")
    ax.legend(fontsize=8, ncols=len(groups), loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out_dir: Path, run: BenchRun) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "plan": run.plan.name,
        "command": run.command,
        "environment": dataclasses.asdict(run.environment),
        "targets": [dataclasses.asdict(c) for c in check_targets(run.results, run.references)],
        # Every row has kind (served | in_process | peer), runtime and precision.
        "rows": [dataclasses.asdict(r) for r in [*run.results, *run.references]],
        "skipped": list(run.skipped),
        "failed": [dataclasses.asdict(f) for f in run.failed],
        "lost": run.lost(),
    }
    (out_dir / "results.json").write_text(json.dumps(document, indent=2))
    (out_dir / "report.md").write_text(markdown(run))
    if run.results:
        chart(run.results, out_dir / "throughput.png", [r for r in run.references if r.kind == "peer"])
    if any(r.cpu_ms_per_request for r in run.results):
        cpu_chart(run.results, out_dir / "cpu_per_request.png")
    latest = out_dir.parent / "latest"
    latest.unlink(missing_ok=True)
    latest.symlink_to(out_dir.name)
