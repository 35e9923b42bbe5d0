"""Archive-time compilation for the precompiled backends (aoti, openvino).

    precompile(handler, model, staging_dir)   # called by model_store/build.py

The handler supplies what the artifact must fit: its settings, the served example shapes
and representative inputs (`sample`) for int8 calibration, decoded as requests are.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

from handlers.aoti import build_packages
from handlers.base import OptimizedHandler, serving_buckets
from handlers.calibration import CALIBRATION_COUNT
from handlers.openvino_backend import build_ir
from handlers.optimize import Inputs, Reference, prepare, to_layout
from handlers.settings import Backend

Progress = Callable[[str], None]


def calibration_batches(handler: OptimizedHandler) -> list[Inputs]:
    """Batches of one representative input each, in the order of handlers/calibration.py."""
    return [tuple(t.unsqueeze(0) for t in handler.sample(index)) for index in range(CALIBRATION_COUNT)]


def _aoti(model: nn.Module, handler: OptimizedHandler, out_dir: Path, progress: Progress) -> None:
    settings = handler.settings

    def served(inputs: Inputs) -> Inputs:
        return to_layout(inputs, settings.channels_last)

    calibration = [served(batch) for batch in calibration_batches(handler)]
    build_packages(
        prepare(model, settings), settings, lambda size: served(handler.example(size)), calibration, out_dir, progress
    )


def _openvino(model: nn.Module, handler: OptimizedHandler, out_dir: Path, progress: Progress) -> None:
    # OpenVINO takes the float32 NCHW model: it chooses layouts and precision itself.
    build_ir(model, handler.settings, handler.example(2), calibration_batches(handler), out_dir, progress)


PRECOMPILERS: dict[Backend, Callable[[nn.Module, OptimizedHandler, Path, Progress], None]] = {
    Backend.AOTI: _aoti,
    Backend.OPENVINO: _openvino,
}


def precompile(handler: OptimizedHandler, model: nn.Module, out_dir: Path, progress: Progress = print) -> None:
    """Write the artifact of the handler's backend and its Reference into out_dir (nothing for other backends)."""
    settings = handler.settings
    builder = PRECOMPILERS.get(settings.backend)
    if builder is None:
        return
    builder(model, handler, out_dir, progress)
    # What the worker's accuracy guard compares the artifact with, at the smallest served batch.
    size = serving_buckets(1, settings)[0]
    Reference.of(prepare(model, settings), handler.checks(size), settings.channels_last).save(out_dir)
