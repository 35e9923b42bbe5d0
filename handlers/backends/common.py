"""What every backend module shares: input and runner types, the build spec, layout and precision.

prepared = prepare(model, settings)            # channels-last, autocast: before any backend
run = backend.build(prepared, settings, BuildSpec(example, (1, 4), model_dir))
logits = run(*to_layout(inputs, settings.channels_last))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from handlers.backends import DType, cpu_refusal
from handlers.settings import OptimizationSettings

Inputs = tuple[torch.Tensor, ...]
Runner = Callable[..., torch.Tensor]

# dtypes reached by autocast at run time; int8 is quantized at archive time, float32 is as is.
AUTOCAST_DTYPES = {DType.BFLOAT16: torch.bfloat16}


class BackendUnavailable(RuntimeError):
    """The configured backend cannot run here (its environment or its artifact is missing)."""


def require_dtype_supported(dtype: DType) -> None:
    if refusal := cpu_refusal(dtype):
        raise BackendUnavailable(refusal)


class CompileError(RuntimeError):
    """The configured backend failed on the warm-up inputs and no fallback was allowed."""


@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """What a backend builder may need besides the model: the served shapes and the archive."""

    example: Inputs  # the first warm-up example, in the served layout
    batch_sizes: tuple[int, ...]  # every batch size that will be served
    model_dir: Path | None = None  # the extracted archive: precompiled backends load from it

    def archive(self) -> Path:
        if self.model_dir is None:
            raise BackendUnavailable("a precompiled backend (aoti, openvino) runs from a built archive only")
        return self.model_dir


class Autocast(nn.Module):
    """Runs `inner` under CPU autocast and hands float32 back, so postprocessing is dtype-agnostic."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.inner = inner
        self.dtype = dtype

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=self.dtype):
            return self.inner(*inputs).float()


def to_layout(inputs: Inputs, channels_last: bool) -> Inputs:
    """Inputs in the memory format the model was prepared for (4-D tensors only)."""
    if not channels_last:
        return inputs
    return tuple(t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t for t in inputs)


def export_shapes(settings: OptimizationSettings, example: Inputs, batch: bool) -> tuple[dict, ...]:
    """torch.export's dynamic_shapes for the served inputs: the settings' varying dimensions (one
    Dim each, shared by every input), and the batch one when a single program serves every batch
    size (AUTO: dynamic unless the model limits it, e.g. a user's exported program that caps it)."""
    dims: dict[int, object] = {0: torch.export.Dim.AUTO} if batch else {}
    for dim, (low, high) in settings.varying_dims().items():
        dims[dim] = torch.export.Dim(f"size{dim}", min=low, max=high)
    return tuple({dim: spec for dim, spec in dims.items() if dim < t.dim()} for t in example)


def mark_varying(inputs: Inputs, dims: Iterable[int]) -> Inputs:
    """Inputs with these dimensions (the settings' varying_dims, the batch) marked dynamic for torch.compile.
    "maybe": a model whose code fixes that size gets one graph per size (all warmed up), not an
    error; for the same reason no bounds are given (a size outside them would be an error too)."""
    for dim in dims:
        for t in inputs:
            torch._dynamo.maybe_mark_dynamic(t, dim)
    return inputs


def prepare(model: nn.Module, settings: OptimizationSettings) -> nn.Module:
    if settings.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if settings.dtype in AUTOCAST_DTYPES:
        model = Autocast(model, AUTOCAST_DTYPES[settings.dtype])
    return model


def short_reason(error: BaseException) -> str:
    """`Type: first line of the message`, for logs and error messages."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"
