"""Archive-time compilation for the precompiled backends (the registry's `precompiled` trait).

    precompile(handler, model, staging_dir)           # called by model_store/build.py
    check = check_artifact(handler, model, staging_dir)    # the worker's guard, now; AccuracyError if it fails
    ship_evidence(handler, model, staging_dir)        # a variant compiled in the worker at bf16: what it judges on

The handler supplies what the artifact must fit: its settings, the served example shapes
and representative inputs (`sample`) for int8 calibration, decoded as requests are. Beside
the artifact goes the accuracy guard's Reference, so a worker never needs the float model.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from handlers.accuracy import (
    ACCURACY_FILE,
    ERROR_METRICS,
    HELD_OUT,
    AccuracyError,
    Agreement,
    Judgement,
    Reference,
    Validation,
    agreement,
    judge,
    tolerance,
)
from handlers.backends import Backend, DType, cpu_flags, cpu_isas, cpuinfo, precompiler
from handlers.backends.common import Inputs
from handlers.base import OptimizedHandler
from handlers.calibration import CALIBRATION_COUNT
from handlers.settings import OptimizationSettings


def precompile(handler: OptimizedHandler, model: nn.Module, out_dir: Path, progress: Callable[[str], None] = print):
    """Write the artifact of the handler's backend and its Reference into out_dir (nothing for other backends)."""
    settings = handler.settings
    if not settings.traits.precompiled:
        return
    calibration = handler.samples.calibration()
    validation = repair_validation(handler, model, calibration)
    precompiler(settings.backend)(model, settings, handler.example, calibration, out_dir, progress, validation)
    # What the worker's accuracy guard compares the artifact with, at the smallest served batch.
    size = settings.serving_buckets(1)[0]
    Reference.of(model, handler.samples.checks(size), settings.channels_last).save(out_dir)  # float32 eager's answers


def judged_in_worker(settings: OptimizationSettings) -> bool:
    """A backend the worker compiles, at a precision that changes answers (bf16): its archive ships
    float eager's answers on every input of the build's evidence (`ship_evidence`), and each worker
    judges what it compiled on all of them before it serves, not on a few check batches."""
    return (
        not settings.traits.precompiled
        and settings.backend is not Backend.EAGER
        and settings.dtype is not DType.FLOAT32
    )


def ship_evidence(handler: OptimizedHandler, model: nn.Module, out_dir: Path) -> int:
    """Write the Reference a `judged_in_worker` variant's workers judge on; returns its inputs' count."""
    size = handler.settings.serving_buckets(1)[0]  # what a lone request is served at
    batches = [
        handler.collate([inputs], size) for found in evidence(handler) if found.decisive for inputs in found.inputs
    ]
    Reference.of(model, batches, handler.settings.channels_last).save(out_dir)
    return len(batches)


# A build judged on fewer held-out inputs than this says so: in issue 39 a quarter of 16 samples,
# four rows, decided that an int8 build answering up to 26 % off was fine.
HELD_OUT_WANTED = 32
HELD_OUT_SYNTHETIC = 32  # held-out inputs of a model given no samples: the kit's synthetic ones


# A model given no samples: an int8 repair looks at this many more synthetic inputs, neither
# calibration nor held-out ones (Samples.validation_extra), beside the calibration inputs.
VALIDATION_EXTRA = 32


def repair_validation(handler: OptimizedHandler, model: nn.Module, calibration: list[Inputs]) -> Validation:
    """What an int8 repair may look at: the calibration inputs, and for a model given no samples
    more synthetic ones; never the held-out inputs the build judges afterwards."""
    batches = list(calibration) + handler.samples.validation_extra(VALIDATION_EXTRA)
    with torch.inference_mode():
        expected = [model(*batch) for batch in batches]
    return Validation(batches, expected, handler.answer, tolerance(handler.settings, handler.answer))


@dataclasses.dataclass(frozen=True)
class Evidence:
    """One set of inputs the build judges an artifact on; a set that is not decisive is reported only."""

    name: str
    inputs: list[Inputs]  # unbatched, as decoded
    decisive: bool = True


def evidence(handler: OptimizedHandler) -> list[Evidence]:
    """Every held-out input, then every input that calibrated, then the kit's synthetic inputs:
    decisive when they stand in for samples the user did not give; beside a user's samples,
    reported only (random rows may be far from what a model is fed). The calibration inputs are
    judged on the artifact too: an int8 repair chose what stays in float by them, and a package
    that answers one of them wrong is as wrong as one that fails a held-out input."""
    samples = handler.samples
    synthetic = [samples.synthetic(CALIBRATION_COUNT + index) for index in range(HELD_OUT_SYNTHETIC)]
    if not samples.user:
        calibration = [samples.synthetic(index) for index in range(CALIBRATION_COUNT)]
        return [Evidence("held-out synthetic inputs", synthetic), Evidence("synthetic calibration inputs", calibration)]
    return [
        Evidence("your held-out samples", [samples.given(body) for body in samples.user.held_out]),
        Evidence("your calibration samples", [samples.given(body) for body in samples.user.calibration]),
        Evidence("synthetic inputs (reported, not decisive)", synthetic, decisive=False),
    ]


@dataclasses.dataclass(frozen=True)
class ArtifactCheck:
    """What the build measured of an artifact, recorded in its archive (ACCURACY_FILE)."""

    backend: str  # what runs: eager after an allowed fallback
    dtype: str
    answer: str  # what is judged (accuracy.Answer)
    metric: str
    tolerance: float
    guard_error: float | None  # the worker's guard on its check inputs (None: it fell back to eager)
    judgements: list[Judgement]  # every set of inputs, against the float eager model
    decisive: list[bool]  # which judgements decide
    agreement: Agreement  # on held-out samples, against the float eager model
    # The CPU it was judged on: its model name, and its ISAS, which decide int8's arithmetic
    # (handlers.backends.int8_refusal: a worker refuses int8 answers its CPU would compute otherwise).
    cpu: str
    judged_on: list[str]

    @property
    def passed(self) -> bool:
        return all(j.passed for j, decisive in zip(self.judgements, self.decisive, strict=True) if decisive)

    @property
    def held_out(self) -> int:
        return len(self.judgements[0].errors)

    def summary(self, classifier: bool) -> str:
        error = "n/a (fell back to eager)" if self.guard_error is None else f"{self.guard_error:.3g}"
        judged = "; ".join(j.line() for j in self.judgements)
        return (
            f"against float32 eager by {self.metric}, tolerance {self.tolerance:.3g}: {judged}; worker guard "
            f"{error}; {self.agreement.summary(classifier)}"
        )


def check_artifact(handler: OptimizedHandler, model: nn.Module, out_dir: Path) -> ArtifactCheck:
    """Load the artifact as a worker does, run its accuracy guard, then judge its answers on every
    input there is (`evidence`): a variant that fails either is refused here (AccuracyError), not
    installed for every worker to serve wrong answers."""
    from handlers.optimize import optimize

    settings, answer = handler.settings, handler.answer
    optimized = optimize(None, settings, [handler.example(settings.serving_buckets(1)[0])], out_dir, answer=answer)
    limit = tolerance(settings, answer)
    sets = evidence(handler)
    judgements = []
    for found in sets:
        batches = [handler.collate([inputs], 1) for inputs in found.inputs]
        with torch.inference_mode():
            expected = [model(*batch) for batch in batches]
        judgements.append(judge(optimized, batches, expected, answer, limit, found.name))
    check = ArtifactCheck(
        optimized.backend.value,
        settings.dtype.value,
        answer.value,
        ERROR_METRICS[answer].formula,
        limit,
        optimized.accuracy_error,
        judgements,
        [found.decisive for found in sets],
        agreement(optimized, model, handler.samples.held_out(HELD_OUT)),
        cpuinfo().get("model name", "unknown"),
        list(cpu_isas(cpu_flags())),
    )
    if not check.passed:
        raise AccuracyError(f"its answers are too far from the float model's: {check.summary(handler.classifier)}")
    (out_dir / ACCURACY_FILE).write_text(json.dumps(dataclasses.asdict(check), indent=1))
    return check
