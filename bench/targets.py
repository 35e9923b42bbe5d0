"""The targets a bench run is checked against, each a line of its report (bench/report.py).

    check_targets(run.results, run.references)   # [TargetCheck(target, measured, met), ...]

Per-model targets (speedup, int8 agreement) are in the model files (kit/models.py Targets); these
are the kit's own: served against in-process, a precompiled worker's cold start, the ITT ranges,
short inputs against typical ones, and no failed response.
"""

from __future__ import annotations

import dataclasses

from bench.payloads import default_payload
from bench.results import InProcessResult, RowResult
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
