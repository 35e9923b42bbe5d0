"""Write a bench run: results.json (machine-readable), report.md (tables + targets), throughput.png.

write_report(out_dir, run)   # run: bench.results.BenchRun

Every table and chart reads the same records (bench/results.py) into the one report, with the
targets bench/targets.py checks; the comparison with peers has its own (bench/versus/report.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from bench.results import BenchRun, InProcessResult, RowResult
from bench.targets import check_targets


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
