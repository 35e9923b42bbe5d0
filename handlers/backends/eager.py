"""Plain PyTorch eager: the prepared model as it is, the reference every other backend is checked against."""

from __future__ import annotations

from torch import nn

from handlers.backends.common import BuildSpec, Runner
from handlers.settings import OptimizationSettings


def build(model: nn.Module, settings: OptimizationSettings, spec: BuildSpec) -> Runner:
    return model
