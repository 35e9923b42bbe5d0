"""The accuracy guard: a backend's outputs against float eager's on the same inputs, per dtype.

    reference = Reference.of(prepared, check_inputs, channels_last)   # or Reference.load(model_dir)
    worst = require_accuracy(optimized, reference, "openvino", Answer.VALUES, tolerance(settings, Answer.VALUES))
    judge(optimized, batches, eager_outputs, Answer.PROBABILITIES, 0.05, "held-out samples").line()
    agreement(optimized, model, handler.samples.held_out(16))    # Agreement(cosine_mean=0.999, cosine_min=0.998, ...)

What is judged is the answer a client gets (`Answer`): a classifier's probabilities, else the
output row itself, by an error that sees scale as well as direction, against the tolerance of
the precision and answer (TOLERANCES), over every input, with the count of those over it.

Backends compiled in the worker build the Reference there. Precompiled ones ship it in the
archive (handlers/precompile.py runs the same eager model), so their workers never build that
model: for BERT that is transformers' import, 440 MB of float weights and the eager runs,
~3 s of a worker's start on one core.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from handlers.backends import DType, cpu_flags, cpu_isas, int8_refusal
from handlers.backends.common import CompileError, Inputs, to_layout
from handlers.settings import OptimizationSettings

# In precompiled archives, and in those a worker compiles at reduced precision (precompile.py).
REFERENCE_FILE = "reference.pt"
ACCURACY_FILE = "accuracy.json"  # in precompiled archives: what the build measured (handlers/precompile.py)


class AccuracyError(CompileError):
    """The backend ran but its answers differ from eager's beyond the tolerance."""


class Answer(enum.Enum):
    """What a client is answered, which is what the guard judges (OptimizedHandler.answer)."""

    PROBABILITIES = "probabilities"  # a classifier: the softmax of its output row
    VALUES = "values"  # tensors and embeddings: the output row as it is


def relative_errors(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Per output row, ||actual - expected|| / ||expected||: scale and direction at once. An answer
    26 % too small in every entry is 0.26 here and ~0 in cosine distance (issue 39)."""
    actual, expected = actual.float().flatten(1), expected.float().flatten(1)
    return (actual - expected).norm(dim=1) / expected.norm(dim=1).clamp_min(1e-12)


def probability_errors(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Per output row, the largest difference of one class's probability; a changed top-1 counts
    as eager's own margin between the two classes when that is larger (a flip between classes
    eager calls all but tied is no wrong answer; a flip past a clear margin is)."""
    actual, expected = actual.float().flatten(1).softmax(1), expected.float().flatten(1).softmax(1)
    differences = (actual - expected).abs().amax(dim=1)
    expected_top = expected.gather(1, expected.argmax(1, keepdim=True))[:, 0]
    margins = expected_top - expected.gather(1, actual.argmax(1, keepdim=True))[:, 0]
    return torch.maximum(differences, margins)


def cosine_distance(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """1 - the lowest cosine similarity between matching output rows: direction, not scale."""
    cosine = torch.nn.functional.cosine_similarity(actual.float().flatten(1), expected.float().flatten(1), dim=1)
    return 1.0 - cosine.min().item()


@dataclasses.dataclass(frozen=True)
class ErrorMetric:
    measure: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # one error per output row
    formula: str  # as the guard's messages and `make doctor` print it


ERROR_METRICS: dict[Answer, ErrorMetric] = {
    Answer.VALUES: ErrorMetric(relative_errors, "||out - ref|| / ||ref|| per answer"),
    Answer.PROBABILITIES: ErrorMetric(
        probability_errors, "largest difference of a class probability per answer (a top-1 flip: eager's margin)"
    ),
}

# How far a backend's answers may be from eager's, per precision and answer: the one place these
# are stated (docs/backends.md says why); a model file's `accuracy_tolerance` (make model ...
# TOLERANCE=) replaces them. float32 compiled code differs from eager by summation order only
# (~1e-6). bfloat16 keeps 8 mantissa bits: the bundled models' answers moved by up to 0.006
# (embeddings) and 0.027 (probabilities) against float32. int8: an answer off by a fifth of its
# size, or a probability off by ten points, is what a user calls wrong; the bundled MiniLM's int8
# embeddings are off by up to 0.17, ResNet-50's int8 probabilities by 0.08 (aoti-int8; openvino-int8
# by 0.18 until repaired, handlers/backends/openvino.py), on the AMX Xeon.
TOLERANCES: dict[tuple[DType, Answer], float] = {
    (DType.FLOAT32, Answer.VALUES): 1e-3,
    (DType.FLOAT32, Answer.PROBABILITIES): 1e-3,
    (DType.BFLOAT16, Answer.VALUES): 0.05,
    (DType.BFLOAT16, Answer.PROBABILITIES): 0.05,
    (DType.INT8, Answer.VALUES): 0.2,
    (DType.INT8, Answer.PROBABILITIES): 0.1,
}


def tolerance(settings: OptimizationSettings, answer: Answer) -> float:
    if settings.accuracy_tolerance is not None:
        return settings.accuracy_tolerance
    return TOLERANCES[(settings.dtype, answer)]


@dataclasses.dataclass(frozen=True)
class Judgement:
    """A backend's answers on one set of inputs against eager's: one error per answer."""

    inputs: str  # which set: "check inputs", "held-out samples", ...
    errors: tuple[float, ...]
    tolerance: float

    @property
    def worst(self) -> float:
        return max(self.errors, default=0.0)

    @property
    def failing(self) -> int:
        return sum(1 for error in self.errors if not error <= self.tolerance)  # NaN fails

    @property
    def passed(self) -> bool:
        return self.failing == 0

    def line(self) -> str:
        median = statistics.median(self.errors) if self.errors else 0.0
        return (
            f"{self.inputs}: {len(self.errors)}, worst {self.worst:.3g}, median {median:.3g}, "
            f"{self.failing} over the tolerance {self.tolerance:.3g}"
        )


# A repair aims this far below the limit on the inputs it sees, so that inputs it never saw land
# within the limit too: the bundled MiniLM's int8 was 0.17 at worst on its 16 calibration
# sentences and 0.25 on one of 32 held-out ones.
REPAIR_MARGIN = 0.75


@dataclasses.dataclass(frozen=True)
class Validation:
    """What an int8 repair must satisfy: inputs (batches of one) it may look at, float eager's
    outputs for them, the answer judged and its limit (handlers/precompile.py builds it from the
    calibration inputs, so the held-out ones stay unseen for the final judgement)."""

    batches: list[Inputs]
    expected: list[torch.Tensor]
    answer: Answer
    limit: float

    @property
    def target(self) -> float:
        """The worst error a repair aims for on these inputs (REPAIR_MARGIN)."""
        return self.limit * REPAIR_MARGIN

    def errors(self, run: Callable[..., torch.Tensor]) -> list[float]:
        return list(judge(run, self.batches, self.expected, self.answer, self.limit, "validation").errors)


def judge(
    run: Callable[..., torch.Tensor],
    batches: Sequence[Inputs],
    expected: Sequence[torch.Tensor],
    answer: Answer,
    limit: float,
    inputs: str,
) -> Judgement:
    """`run` on every batch against eager's outputs for them, by the answer's metric."""
    errors: list[float] = []
    with torch.inference_mode():
        for batch, reference in zip(batches, expected, strict=True):
            errors += ERROR_METRICS[answer].measure(run(*batch), reference).tolist()
    return Judgement(inputs, tuple(errors), limit)


@dataclasses.dataclass(frozen=True)
class Reference:
    """The accuracy guard's input batches and what the float eager model returns for them."""

    inputs: list[Inputs]
    outputs: list[torch.Tensor]

    @classmethod
    def of(cls, model: nn.Module, inputs: Sequence[Inputs], channels_last: bool) -> Reference:
        with torch.inference_mode():
            return cls(list(inputs), [model(*to_layout(batch, channels_last)) for batch in inputs])

    @staticmethod
    def shipped(model_dir: Path | None) -> bool:
        return model_dir is not None and (model_dir / REFERENCE_FILE).is_file()

    def save(self, model_dir: Path) -> None:
        torch.save({"inputs": self.inputs, "outputs": self.outputs}, model_dir / REFERENCE_FILE)

    @classmethod
    def load(cls, model_dir: Path) -> Reference:
        path = model_dir / REFERENCE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing from the archive; rebuild it with `make archive`")
        saved = torch.load(path, map_location="cpu", weights_only=True)
        return cls([tuple(batch) for batch in saved["inputs"]], saved["outputs"])


def judged_on(model_dir: Path) -> tuple[str, ...]:
    """The ISAS of the CPU a build judged its artifact on (ACCURACY_FILE's `judged_on`); () when the
    archive does not say (the build itself, before it writes the file)."""
    path = model_dir / ACCURACY_FILE
    return tuple(json.loads(path.read_text()).get("judged_on", ())) if path.is_file() else ()


def require_judged_arithmetic(model_dir: Path, backend: str) -> None:
    """AccuracyError when this CPU's int8 arithmetic is one the build's judgement does not cover."""
    if refusal := int8_refusal(judged_on(model_dir), cpu_isas(cpu_flags())):
        raise AccuracyError(f"backend {backend!r}: {refusal}")


def require_accuracy(
    run: Callable[..., torch.Tensor], reference: Reference, backend: str, answer: Answer, limit: float
) -> float:
    """The worst error to eager on the reference's inputs, or AccuracyError when any is above `limit` (or NaN)."""
    judgement = judge(run, reference.inputs, reference.outputs, answer, limit, "check inputs")
    if not judgement.passed:
        raise AccuracyError(
            f"backend {backend!r} answers differently from eager on {judgement.failing} of {len(judgement.errors)} "
            f"check inputs: worst {judgement.worst:.3g} ({ERROR_METRICS[answer].formula}; tolerance {limit:.3g}); "
            "run `make doctor` on this model to find the failing component, or set `fallback_to_eager: true` "
            "in model-config.yaml"
        )
    return judgement.worst


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


def agreement(run: Callable[..., torch.Tensor], reference: nn.Module, held_out: Sequence[Inputs]) -> Agreement:
    """`run` against the float `reference` on held-out inputs (Samples.held_out(HELD_OUT)), one per call."""
    cosines, same, probability_diffs = [], 0, []
    with torch.inference_mode():
        for inputs in held_out:
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
