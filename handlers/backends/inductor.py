"""torch.compile with Inductor and weight freezing, compiled in the worker by its warm-up calls.

run = build(prepared, settings, spec)   # compiles lazily: the first call per shape
"""

from __future__ import annotations

import torch
from torch import nn

from handlers.backends.common import BuildSpec, Runner
from handlers.settings import OptimizationSettings


def inductor_options(settings: OptimizationSettings) -> dict:
    """Inductor's options for the settings' mode (torch.compile takes `mode` or `options`, not both)."""
    options = torch._inductor.list_mode_options(settings.mode.value)
    options.pop("triton.cudagraphs", None)  # a GPU feature; meaningless on CPU
    return options


def build(model: nn.Module, settings: OptimizationSettings, spec: BuildSpec) -> Runner:
    # Freezing (weights as constants: conv-BN folding, prepacked oneDNN weights) is read when AOT
    # Autograd compiles, lazily inside the first calls and outside torch.compile(options=...)'s
    # scope: passed there it is silently ignored (torch 2.13). A worker process serves one model,
    # so it is set process-wide: recompiles get it too, serving calls pay nothing for it, and the
    # minifier's repro scripts (which record the global config) reproduce it.
    torch._inductor.config.freezing = True
    # dynamic=False: every served shape is warmed up, so static kernels are safe and fastest.
    return torch.compile(model, backend="inductor", options=inductor_options(settings), dynamic=False)
