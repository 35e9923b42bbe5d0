"""The accuracy guard: a backend's outputs against float eager's on the same inputs, per dtype.

    reference = Reference.of(prepared, check_inputs, channels_last)   # or Reference.load(model_dir)
    error = accuracy_error(optimized, reference, settings.dtype)       # AccuracyError above tolerance
    agreement(optimized, model, handler)    # Agreement(cosine_mean=0.999, cosine_min=0.998, top1_agreement=1.0)

Backends compiled in the worker build the Reference there. Precompiled ones ship it in the
archive (handlers/precompile.py runs the same eager model), so their workers never build that
model: for BERT that is transformers' import, 440 MB of float weights and the eager runs,
~3 s of a worker's start on one core.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from handlers.base import OptimizedHandler

from handlers.backends import DType
from handlers.backends.common import CompileError, Inputs, to_layout

REFERENCE_FILE = "reference.pt"  # in precompiled archives
ACCURACY_FILE = "accuracy.json"  # in precompiled archives: what the build measured (handlers/precompile.py)


class AccuracyError(CompileError):
    """The backend ran but its outputs differ from eager beyond the configured tolerance."""


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / (1 + |expected|): absolute near zero, relative for large values."""
    return ((actual.float() - expected.float()).abs() / (1 + expected.float().abs())).max().item()


def cosine_distance(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """1 - the lowest cosine similarity between matching output rows: direction, not scale."""
    cosine = torch.nn.functional.cosine_similarity(actual.float().flatten(1), expected.float().flatten(1), dim=1)
    return 1.0 - cosine.min().item()


@dataclasses.dataclass(frozen=True)
class ErrorMetric:
    measure: Callable[[torch.Tensor, torch.Tensor], float]
    formula: str  # as the guard's messages and `make doctor` print it


# How far a backend may be from eager, per dtype (tolerances in settings.ACCURACY_TOLERANCE).
# bfloat16 (against eager under bf16 autocast) and int8 (against float32 eager) are compared by
# the direction of each output row, which ranking, top-k and embeddings depend on: their
# element-wise error scales with the values (ResNet-50 through OpenVINO's bf16 hint against eager
# bf16: 0.069 element-wise on random-weight logits; against float32, held-out cosine >= 0.99995).
ERROR_METRICS: dict[DType, ErrorMetric] = {
    DType.FLOAT32: ErrorMetric(relative_error, "max |out - ref| / (1 + |ref|)"),
    DType.BFLOAT16: ErrorMetric(cosine_distance, "cosine distance per output row"),
    DType.INT8: ErrorMetric(cosine_distance, "cosine distance per output row"),
}


@dataclasses.dataclass(frozen=True)
class Reference:
    """The accuracy guard's input batches and what the float eager model returns for them."""

    inputs: list[Inputs]
    outputs: list[torch.Tensor]

    @classmethod
    def of(cls, model: nn.Module, inputs: Sequence[Inputs], channels_last: bool) -> Reference:
        with torch.inference_mode():
            return cls(list(inputs), [model(*to_layout(batch, channels_last)) for batch in inputs])

    def save(self, model_dir: Path) -> None:
        torch.save({"inputs": self.inputs, "outputs": self.outputs}, model_dir / REFERENCE_FILE)

    @classmethod
    def load(cls, model_dir: Path) -> Reference:
        path = model_dir / REFERENCE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing from the archive; rebuild it with `make archive`")
        saved = torch.load(path, map_location="cpu", weights_only=True)
        return cls([tuple(batch) for batch in saved["inputs"]], saved["outputs"])


def accuracy_error(run: Callable[..., torch.Tensor], reference: Reference, dtype: DType = DType.FLOAT32) -> float:
    """Largest difference to eager on the reference inputs, by the dtype's metric."""
    with torch.inference_mode():
        pairs = zip(reference.inputs, reference.outputs, strict=True)
        return max(ERROR_METRICS[dtype].measure(run(*inputs), expected) for inputs, expected in pairs)


def require_accuracy(
    run: Callable[..., torch.Tensor], reference: Reference, backend: str, dtype: DType, tolerance: float
) -> float:
    """The error to eager, or AccuracyError when it is above `tolerance` (or NaN)."""
    error = accuracy_error(run, reference, dtype)
    if not error <= tolerance:  # also catches NaN
        raise AccuracyError(
            f"backend {backend!r} differs from eager by {error:.3g} on the check inputs "
            f"({ERROR_METRICS[dtype].formula}, tolerance {tolerance:.3g}); run `make doctor` on this model to find the failing "
            "component, or set `fallback_to_eager: true` in model-config.yaml"
        )
    return error


# -- agreement on held-out samples: what the build records and the bench reports ------------------
# Held-out = the samples after the int8 calibration set (OptimizedHandler.held_out), one per call.
# Top-1 agreement is meaningful for classifiers (random weights: a near-tie between logits can
# flip, so it is a pessimistic figure), cosine for every output.
HELD_OUT = 16


@dataclasses.dataclass(frozen=True)
class Agreement:
    cosine_mean: float  # cosine similarity of output rows to float32 eager, averaged
    cosine_min: float  # the lowest one
    top1_agreement: float  # share of inputs whose arg-max equals float32 eager's
    # The largest difference of one class's softmax probability: what a classifier's client sees.
    probability_diff_max: float

    def summary(self, classifier: bool) -> str:
        cosine = f"held-out cosine mean {self.cosine_mean:.4f} min {self.cosine_min:.4f}"
        if not classifier:  # embeddings and tensors: the direction of the output is the answer
            return cosine
        return f"{cosine}, top-1 agreement {self.top1_agreement:.0%}, largest probability difference {self.probability_diff_max:.3g}"


def agreement(
    run: Callable[..., torch.Tensor], reference: nn.Module, handler: OptimizedHandler, count: int = HELD_OUT
) -> Agreement:
    cosines, same, probability_diffs = [], 0, []
    with torch.inference_mode():
        for inputs in handler.held_out(count):
            expected = reference(*inputs).float().flatten()
            actual = run(*inputs).float().flatten()
            cosines.append(torch.nn.functional.cosine_similarity(actual, expected, dim=0).item())
            same += int(actual.argmax() == expected.argmax())
            probability_diffs.append((actual.softmax(0) - expected.softmax(0)).abs().max().item())
    return Agreement(
        round(sum(cosines) / len(cosines), 5),
        round(min(cosines), 5),
        same / len(cosines),
        round(max(probability_diffs), 5),
    )
