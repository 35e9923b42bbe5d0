"""Agreement of a run with the float32 eager model on held-out representative inputs.

    agreement(optimized, archived.model, archived.handler)   # Agreement(cosine_min=0.998, top1_agreement=1.0)

Held-out = the samples after the int8 calibration set (handlers/calibration.py), one per call.
Top-1 agreement is meaningful for classifiers (random weights: a near-tie between logits can
flip, so it is a pessimistic figure), cosine for embeddings and classifiers alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from handlers.base import OptimizedHandler

HELD_OUT = 16


@dataclasses.dataclass(frozen=True)
class Agreement:
    cosine_mean: float  # cosine similarity of output rows to float32 eager, averaged
    cosine_min: float  # the lowest one
    top1_agreement: float  # share of inputs whose arg-max equals float32 eager's


def agreement(
    run: Callable[..., torch.Tensor], reference: nn.Module, handler: OptimizedHandler, count: int = HELD_OUT
) -> Agreement:
    cosines, same = [], 0
    with torch.inference_mode():
        for inputs in handler.held_out(count):
            expected = reference(*inputs).float().flatten()
            actual = run(*inputs).float().flatten()
            cosines.append(torch.nn.functional.cosine_similarity(actual, expected, dim=0).item())
            same += int(actual.argmax() == expected.argmax())
    return Agreement(round(sum(cosines) / len(cosines), 5), round(min(cosines), 5), same / len(cosines))
