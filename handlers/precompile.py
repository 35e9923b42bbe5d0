"""Archive-time compilation for the precompiled backends (the registry's `precompiled` trait).

    precompile(handler, model, staging_dir)           # called by model_store/build.py
    check = check_artifact(handler, model, staging_dir)    # the worker's guard, now; AccuracyError if it fails

The handler supplies what the artifact must fit: its settings, the served example shapes
and representative inputs (`sample`) for int8 calibration, decoded as requests are. Beside
the artifact goes the accuracy guard's Reference, so a worker never needs the float model.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from torch import nn

from handlers.accuracy import ACCURACY_FILE, Agreement, Reference, agreement
from handlers.backends import precompiler
from handlers.backends.common import prepare
from handlers.base import OptimizedHandler


def precompile(handler: OptimizedHandler, model: nn.Module, out_dir: Path, progress: Callable[[str], None] = print):
    """Write the artifact of the handler's backend and its Reference into out_dir (nothing for other backends)."""
    settings = handler.settings
    if not settings.traits.precompiled:
        return
    precompiler(settings.backend)(model, settings, handler.example, handler.calibration(), out_dir, progress)
    # What the worker's accuracy guard compares the artifact with, at the smallest served batch.
    size = settings.serving_buckets(1)[0]
    Reference.of(prepare(model, settings), handler.checks(size), settings.channels_last).save(out_dir)


@dataclasses.dataclass(frozen=True)
class ArtifactCheck:
    """What the build measured of an artifact, recorded in its archive (ACCURACY_FILE)."""

    backend: str  # what runs: eager after an allowed fallback
    dtype: str
    guard_error: float | None  # the worker's guard (None: it fell back to eager)
    tolerance: float
    agreement: Agreement  # on held-out samples, against the float eager model

    def summary(self, classifier: bool) -> str:
        error = "n/a (fell back to eager)" if self.guard_error is None else f"{self.guard_error:.3g}"
        return f"against float32 eager, guard error {error} (tolerance {self.tolerance:.3g}); {self.agreement.summary(classifier)}"


def check_artifact(handler: OptimizedHandler, model: nn.Module, out_dir: Path) -> ArtifactCheck:
    """Load the artifact as a worker does and run its accuracy guard: a variant that fails is
    refused here (AccuracyError), not by every worker that starts it."""
    from handlers.optimize import optimize

    settings = handler.settings
    optimized = optimize(None, settings, [handler.example(settings.serving_buckets(1)[0])], out_dir)
    check = ArtifactCheck(
        optimized.backend.value,
        settings.dtype.value,
        optimized.accuracy_error,
        settings.tolerance,
        agreement(optimized, model, handler),
    )
    (out_dir / ACCURACY_FILE).write_text(json.dumps(dataclasses.asdict(check), indent=1))
    return check
