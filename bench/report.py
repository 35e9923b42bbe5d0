"""Write a bench run: results.json (machine-readable), report.md (tables + targets), throughput.png.

write_report(out_dir, plan, environment, results)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from bench.plan import Plan
from bench.runner import RowResult

# Targets of the bench issue, checked on every run: (model, minimum speedup of the best row).
SPEEDUP_TARGETS = {"resnet50": 3.0, "bert": 2.0}
SERVED_VS_IN_PROCESS_TARGET = 0.90


@dataclasses.dataclass(frozen=True)
class TargetCheck:
    target: str
    measured: str
    met: bool


def best_row(results: list[RowResult], model: str) -> RowResult | None:
    rows = [r for r in results if r.model == model and r.non_2xx == 0 and r.failed == 0]
    return max(rows, key=lambda r: r.requests_per_s, default=None)


def check_targets(results: list[RowResult]) -> list[TargetCheck]:
    checks = []
    for model, target in SPEEDUP_TARGETS.items():
        best = best_row(results, model)
        if best is None or best.speedup_vs_baseline is None:
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
    bad = [f"{r.model}/{r.name}: {r.non_2xx} non-2xx, {r.failed} failed" for r in results if r.non_2xx or r.failed]
    checks.append(TargetCheck("zero non-2xx responses in every row", "; ".join(bad) or "0 in all rows", not bad))
    return checks


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(
    plan: Plan, environment: dict[str, Any], results: list[RowResult], command: str, skipped: list[str] = ()
) -> str:
    lines = [
        f"# Bench `{plan.name}`",
        "",
        f"`{command}` — {environment['date']}, {environment['cpu_model']}, {environment['cores']} cores, "
        f"torch {environment['torch']}, TorchServe {environment['torchserve']}, commit {environment['git_commit']}",
        "",
        f"ab -k for {plan.run.seconds}s per row after {plan.run.warmup_requests} warm-up requests; "
        "one item per request. In-process = the same model and layout without a server.",
        "",
    ]
    for model in sorted({r.model for r in results}, key=lambda m: [r.model for r in results].index(m)):
        lines += [
            f"## {model}",
            "",
            "| row | backend | launcher | allocator (loaded) | W×T | batch | c | req/s | speedup | p50 ms | p90 ms | "
            "p99 ms | non-2xx | TS total/queue ms | in-process items/s | served/in-process | ready s | RSS MB |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in results if r.model == model):
            layout = f"{r.workers or 'def'}×{r.threads or 'def'}"
            loaded = ",".join(sorted(set(r.allocator_loaded))) or "?"
            ts = f"{_fmt(r.ts_inference_ms)}/{_fmt(r.ts_queue_ms)}"
            speedup = f"{r.speedup_vs_baseline:.2f}×" if r.speedup_vs_baseline else "–"
            ratio = f"{r.served_vs_in_process:.0%}" if r.served_vs_in_process else "–"
            name = f"**{r.name}**" if r.baseline else r.name
            lines.append(
                f"| {name} | {r.variant} | {'on' if r.launcher else 'off'} | {r.allocator} ({loaded}) | {layout} | "
                f"{r.batch_size} | {r.concurrency} | {r.requests_per_s:.1f} | {speedup} | {r.p50_ms:.0f} | "
                f"{r.p90_ms:.0f} | {r.p99_ms:.0f} | {r.non_2xx} | {ts} | {_fmt(r.in_process_items_per_s)} | {ratio} | "
                f"{r.start_to_ready_s:.0f} | {_fmt(sum(r.worker_rss_mb), 0)} |"
            )
        lines.append("")
    if skipped:
        lines += ["## Skipped rows", "", *(f"- {reason}" for reason in skipped), ""]
    lines += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for check in check_targets(results):
        lines.append(f"| {check.target} | {check.measured} | {'yes' if check.met else '**no**'} |")
    lines.append("")
    return "\n".join(lines)


def chart(results: list[RowResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.model for r in results))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        rows = [r for r in results if r.model == model]
        colours = ["#888888" if r.baseline else "#1f77b4" for r in rows]
        bars = ax.barh([r.name for r in rows], [r.requests_per_s for r in rows], color=colours)
        for bar, r in zip(bars, rows, strict=True):
            label = f"{r.requests_per_s:.1f}" + (f" ({r.speedup_vs_baseline:.1f}×)" if r.speedup_vs_baseline else "")
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {label}", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{model}: requests/s (grey = baseline)")
        ax.set_xlabel("requests/s")
        ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(
    out_dir: Path,
    plan: Plan,
    environment: dict[str, Any],
    results: list[RowResult],
    command: str,
    skipped: list[str] = (),
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "plan": plan.name,
        "command": command,
        "environment": environment,
        "targets": [dataclasses.asdict(c) for c in check_targets(results)],
        "rows": [dataclasses.asdict(r) for r in results],
        "skipped": list(skipped),
    }
    (out_dir / "results.json").write_text(json.dumps(document, indent=2))
    (out_dir / "report.md").write_text(markdown(plan, environment, results, command, skipped))
    if results:
        chart(results, out_dir / "throughput.png")
    latest = out_dir.parent / "latest"
    latest.unlink(missing_ok=True)
    latest.symlink_to(out_dir.name)
