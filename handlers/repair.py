"""Repair before refusing: an int8 build whose answers are too far from float keeps its costliest
operations in float, chosen by measuring, then the held-out inputs judge it as any build.

    model = repaired_if_needed(quantized, Quantizer(groups, quantize, runner, speed), validation, progress)

Quantizable operations come in groups, one role in every layer (a transformer's FFN
up-projections, a stage's 3x3 convolutions, a classifier's last linear): per group, not per
operation, because each trial is a whole quantization (seconds) and a role's error is alike in
every layer. Greedy: of the groups still in int8, keep in float the one whose float-keeping lowers
the worst error on the validation inputs the most; repeat until the worst is within the
validation's target (3/4 of the limit, accuracy.REPAIR_MARGIN) or keeping more gains nothing.
Groups are tried smallest first, and the first that brings the worst within the target ends the
search: the fewest operations in float that suffice, found without quantizing once per group
every round (a ResNet-50 has 21 groups, each trial a whole quantization).
NNCF's own accuracy control was tried first for OpenVINO: on MiniLM it put all 36 MatMuls back in
float and answered worse (1.37, NNCF 3.4.0), so the kit measures the groups itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from handlers.accuracy import Validation


@dataclasses.dataclass(frozen=True)
class Quantizer:
    """A backend's side of a repair."""

    groups: list[list[str]]  # names of the quantizable operations, by role
    quantize: Callable[[Sequence[str]], Any]  # the int8 model with these operations in float
    runner: Callable[[Any], Callable[..., torch.Tensor]]  # a model -> what validation calls
    speed: Callable[[Any], float] | None = None  # a model -> in-process items/s (None: not measured)


def worst(model: Any, quantizer: Quantizer, validation: Validation) -> float:
    return max(validation.errors(quantizer.runner(model)))


def repaired_if_needed(
    quantized: Any, quantizer: Quantizer, validation: Validation, progress: Callable[[str], None]
) -> Any:
    """`quantized`, or its repair when its worst error on `validation` is over the target; each
    step, what stayed in float and the speed it cost are printed."""
    before = worst(quantized, quantizer, validation)
    if before <= validation.target:
        return quantized
    progress(
        f"int8 answers differ by up to {before:.3g} on {len(validation.batches)} inputs it may look at (limit "
        f"{validation.limit:.3g}, aiming at {validation.target:.3g} there): keeping the most costly operations in float"
    )
    start = time.perf_counter()
    groups, in_float = sorted(quantizer.groups, key=len), []
    best, best_worst = None, before
    while groups:
        error, group, model = best_trial(groups, in_float, quantizer, validation)
        if error >= best_worst:
            break  # nothing left helps
        groups.remove(group)
        in_float, best, best_worst = [*in_float, *group], model, error
        progress(f"int8 repair: {len(group)} operation(s) like {group[0]} kept in float: worst error {error:.3g}")
        if error <= validation.target:
            break
    if best is None:
        progress("int8 repair: keeping operations in float gained nothing; the build judges the plain int8")
        return quantized
    total = sum(len(group) for group in quantizer.groups)
    speed = ""
    if quantizer.speed is not None:
        speed = f"; in-process {quantizer.speed(quantized):.1f} -> {quantizer.speed(best):.1f} items/s at batch 1"
    progress(
        f"int8 repaired in {time.perf_counter() - start:.0f}s: {len(in_float)} of {total} quantizable operations "
        f"kept in float ({', '.join(in_float[:4])}{', ...' if len(in_float) > 4 else ''}); worst error {before:.3g} -> "
        f"{best_worst:.3g}{speed}"
    )
    return best


def best_trial(
    groups: list[list[str]], in_float: list[str], quantizer: Quantizer, validation: Validation
) -> tuple[float, list[str], Any]:
    """(worst error, group, model) of the first group (smallest first) whose float-keeping brings
    the worst within the target, else of the group whose float-keeping helps most."""
    trials = []
    for group in groups:
        model = quantizer.quantize([*in_float, *group])
        trials.append((worst(model, quantizer, validation), group, model))
        if trials[-1][0] <= validation.target:
            return trials[-1]
    return min(trials, key=lambda trial: trial[0])
