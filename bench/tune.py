"""Pick the fastest serving layout from a bench run and write it as a preset.

    path = write_tuned_preset("tuned", results, failed)   # -> config/presets/tuned.yaml (+ config/tuned.properties)

One TorchServe serves every model, so the layout (placement, threads, allocator, batching) is
shared: the winner is the layout with the best geometric mean, over the models measured, of
its req/s relative to that model's best row. The backend is each model's own: within the
winning layout every model keeps its fastest variant (`model_variants` for those that differ
from the preset's `variant`). The header states the gain over the automatic plan (the rows
that ran the optimized preset as it is) and names the rows that failed: the choice is among the
rows that ran.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from bench.results import RowFailure, RowResult
from kit.paths import CONFIG, STORE
from kit.properties import render
from kit.serve_config import PRESETS, Placement, ServeConfig
from kit.server_state import link_store
from kit.topology import read_topology
from kit.variant import Variant

# What one TorchServe shares between its models; the variant is chosen per model.
SHARED_FIELDS = (
    "placement",
    "objective",
    "allocator",
    "omp_wait_policy",
    "workers",
    "threads",
    "batch_size",
    "max_batch_delay_ms",
)


def shared_layout(row: RowResult) -> tuple:
    return tuple(getattr(row, field) for field in SHARED_FIELDS)


def runs_in(row: RowResult, layout: tuple) -> bool:
    """Whether `row` measured its variant as it would run in the shared `layout`. A variant that
    cannot preload an allocator (OpenVINO) keeps glibc malloc under any allocator setting."""
    mine = dict(zip(SHARED_FIELDS, shared_layout(row), strict=True))
    theirs = dict(zip(SHARED_FIELDS, layout, strict=True))
    if not Variant.load(row.variant).preloaded_allocator:
        mine["allocator"] = theirs["allocator"]
    return mine == theirs


def fastest_layout(results: list[RowResult]) -> tuple[dict, dict[str, RowResult]]:
    """The winning layout (shared fields, `variant`, `model_variants`) and, per model, its row."""
    healthy = [r for r in results if r.non_2xx == 0 and r.failed == 0]
    models = sorted({r.model for r in healthy})
    best = {m: max(r.requests_per_s for r in healthy if r.model == m) for m in models}

    def winners(layout: tuple) -> dict[str, RowResult]:
        rows = {}
        for r in healthy:
            if runs_in(r, layout) and r.requests_per_s > getattr(rows.get(r.model), "requests_per_s", 0.0):
                rows[r.model] = r
        return rows

    candidates = {layout: winners(layout) for layout in {shared_layout(r) for r in healthy}}
    complete = {layout: rows for layout, rows in candidates.items() if len(rows) == len(models)}
    if not complete:
        raise ValueError("no layout was measured for every model without errors; nothing to choose from")

    def score(rows: dict[str, RowResult]) -> float:
        return math.exp(sum(math.log(rows[m].requests_per_s / best[m]) for m in models) / len(models))

    layout, rows = max(sorted(complete.items(), key=str), key=lambda item: score(item[1]))
    chosen = {m: rows[m].variant for m in models}
    # The preset's variant is the one most models chose (ties: by name); the rest are overrides.
    variant = max(sorted(set(chosen.values())), key=list(chosen.values()).count)
    overrides = {m: v for m, v in chosen.items() if v != variant}
    return {
        "variant": variant,
        **({"model_variants": overrides} if overrides else {}),
        **dict(zip(SHARED_FIELDS, layout, strict=True)),
    }, rows


def automatic_rows(results: list[RowResult]) -> dict[str, float]:
    """Per model, req/s of the rows that served the optimized preset unchanged."""
    preset = ServeConfig.from_preset("optimized")
    planned = preset.layout(read_topology())
    same = {
        "variant": preset.variant.name,
        "placement": preset.placement.value,
        "objective": preset.objective.value,
        "allocator": preset.served_allocator.value,
        "batch_size": preset.batch_size,
        "threads": max(w.threads for model in planned.models.values() for w in model.workers),
    }
    return {
        r.model: r.requests_per_s
        for r in results
        if all(getattr(r, field) == value for field, value in same.items()) and not r.cpus
    }


def write_tuned_preset(name: str, results: list[RowResult], failed: list[RowFailure] = ()) -> Path:
    layout, rows = fastest_layout(results)
    if layout["placement"] == Placement.PLAN:
        del layout["workers"]  # the plan decides them; threads, as measured, is its cores per worker
    # The models measured, and no others: a model the run did not measure has no measured variant,
    # and may have no archive of the one chosen for the others.
    layout = {"models": sorted(rows), **layout}
    baselines = {r.model: r.requests_per_s for r in results if r.baseline}
    automatic = automatic_rows(results)

    def gain(model: str, row: RowResult) -> str:
        value = row.requests_per_s
        parts = [f"{value / baselines[model]:.2f}x baseline"] if baselines.get(model) else []
        parts += [f"{value / automatic[model] - 1:+.0%} over the automatic plan"] if automatic.get(model) else []
        return f"{model} {value:.1f} req/s on {row.variant}" + (f" ({', '.join(parts)})" if parts else "")

    gains = ", ".join(gain(m, row) for m, row in sorted(rows.items()))
    header = f"# Written by `make tune` from a measured run: {gains}\n"
    if failed:
        header += f"# Chosen without the rows that failed: {', '.join(f'{f.model} / {f.name}' for f in failed)}\n"
    path = save_preset(name, layout, header)
    print(f"[tune] winner: {layout} -> {gains}")
    return path


def save_preset(name: str, layout: dict, header: str, keep_header: bool = False) -> Path:
    """config/presets/<name>.yaml (after `header`, and the file's own comments when `keep_header`),
    validated, and config/<name>.properties rendered from it."""
    path = PRESETS / f"{name}.yaml"
    if keep_header and path.is_file():
        header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#")) + header
    path.write_text(header + yaml.safe_dump(layout, sort_keys=False))
    config = ServeConfig.from_preset(name)  # validates what was written
    # For TorchServe started by hand; placement plan pins only through `make serve CONFIG=<name>`.
    # Models of different variants: their archives linked into model_store/<name>/ as they are now.
    store = config.variant.store
    if config.mixed_variants:
        store = STORE / name
        link_store(config.archives(), store)
    (CONFIG / f"{name}.properties").write_text(render(config, store, config.layout(read_topology())))
    return path
