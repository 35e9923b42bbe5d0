"""Pick the fastest serving layout from a bench run and write it as a preset.

    path = write_tuned_preset("tuned", results)   # -> config/presets/tuned.yaml (+ config/tuned.properties)

A preset applies to every model, so the winner is the layout with the best geometric mean,
over the models measured, of its req/s relative to that model's best row. Its header states
the gain over the automatic plan (the rows that ran the optimized preset as it is).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import yaml

from bench.results import RowResult
from kit.paths import CONFIG
from kit.serve_config import PRESETS, Placement, ServeConfig, render
from kit.topology import read_topology

LAYOUT_FIELDS = ("variant", "placement", "objective", "allocator", "omp_wait_policy", "workers", "threads",
                 "batch_size", "max_batch_delay_ms")  # fmt: skip


def layout_of(row: RowResult) -> tuple:
    return tuple(getattr(row, field) for field in LAYOUT_FIELDS)


def fastest_layout(results: list[RowResult]) -> tuple[dict, dict[str, float]]:
    """The winning layout and, per model, its req/s."""
    healthy = [r for r in results if r.non_2xx == 0 and r.failed == 0]
    models = sorted({r.model for r in healthy})
    best = {m: max(r.requests_per_s for r in healthy if r.model == m) for m in models}
    by_layout: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in healthy:
        by_layout[layout_of(r)][r.model] = max(r.requests_per_s, by_layout[layout_of(r)].get(r.model, 0.0))
    complete = {layout: rps for layout, rps in by_layout.items() if set(rps) == set(models)}
    if not complete:
        raise ValueError("no layout was measured for every model without errors; nothing to choose from")

    def score(rps: dict[str, float]) -> float:
        return math.exp(sum(math.log(rps[m] / best[m]) for m in models) / len(models))

    layout, rps = max(complete.items(), key=lambda item: score(item[1]))
    return dict(zip(LAYOUT_FIELDS, layout, strict=True)), rps


def automatic_rows(results: list[RowResult]) -> dict[str, float]:
    """Per model, req/s of the rows that served the optimized preset unchanged."""
    preset = ServeConfig.from_preset("optimized")
    planned = preset.layout(read_topology())
    same = {
        "variant": preset.variant.name, "placement": preset.placement.value, "objective": preset.objective.value,
        "allocator": preset.served_allocator.value, "batch_size": preset.batch_size,
        "threads": max(w.threads for model in planned.models.values() for w in model.workers),
    }  # fmt: skip
    return {
        r.model: r.requests_per_s
        for r in results
        if all(getattr(r, field) == value for field, value in same.items()) and not r.cpus
    }


def write_tuned_preset(name: str, results: list[RowResult]) -> Path:
    layout, rps = fastest_layout(results)
    if layout["placement"] == Placement.PLAN:
        del layout["workers"]  # the plan decides them; threads, as measured, is its cores per worker
    baselines = {r.model: r.requests_per_s for r in results if r.baseline}
    automatic = automatic_rows(results)

    def gain(model: str, value: float) -> str:
        parts = [f"{value / baselines[model]:.2f}x baseline"] if baselines.get(model) else []
        parts += [f"{value / automatic[model] - 1:+.0%} over the automatic plan"] if automatic.get(model) else []
        return f"{model} {value:.1f} req/s" + (f" ({', '.join(parts)})" if parts else "")

    gains = ", ".join(gain(m, v) for m, v in sorted(rps.items()))
    path = PRESETS / f"{name}.yaml"
    header = f"# Written by `make tune` from a measured run: {gains}\n"
    path.write_text(header + yaml.safe_dump(layout, sort_keys=False))
    config = ServeConfig.from_preset(name)  # validates what was written
    # For TorchServe started by hand; placement plan pins only through `make serve CONFIG=<name>`.
    (CONFIG / f"{name}.properties").write_text(render(config, config.variant.store, config.layout(read_topology())))
    print(f"[tune] winner: {layout} -> {gains}")
    return path
