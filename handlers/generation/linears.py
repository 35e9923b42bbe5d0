"""A language model's linear layers as kernels the compiler calls but does not look into.

    count = replace_linears(model, Packed.of, torch.float32)    # before torch.compile; each nn.Linear swapped

A language model compiles several graphs (prefill, decode of one and of many rows). A weight the
compiler sees becomes a constant of each graph it freezes, or a tensor subclass it traces into
every graph; a weight behind an operator it does not look into is stored once, for every graph,
in the layout its kernel wants, and the kernel can choose at each call by the rows it is given.
The graphs name a kernel by its key (an int): an opaque tensor cannot be a graph input. A kernel
of the kit's C++ library (row_linear.Rows) is held there under the same key, and the graphs call
the library's operator for it: no Python between a graph and the product (`kit::linear` goes
through Python to find the key's kernel, for the others: oneDNN's packed weights, int8).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from handlers.generation.file_pages import FilePages


class Kernel(Protocol):
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Held(Protocol):
    """A kernel the kit's C++ library can hold under a key (row_linear.Rows): a graph then calls
    the library's operator for it, with no Python between."""

    def held(self, key: int) -> torch._ops.OpOverload: ...


KERNELS: dict[int, Kernel] = {}


# Defined with torch.library's Library and a CPU kernel, not `torch.library.custom_op`: a decode
# step calls it once per linear layer (169 times for Qwen2.5-0.5B's shape), and custom_op's
# wrapping cost 16 us more a call (40 against 24 us on a 64x64 weight: 2-core Xeon, medians of 7
# runs of 3,000 calls in one process), ~2.7 ms of a one-stream decode step.
_LIBRARY = torch.library.Library("kit", "FRAGMENT")
_LIBRARY.define("linear(Tensor x, int key) -> Tensor")


def _linear(x: torch.Tensor, key: int) -> torch.Tensor:
    return KERNELS[key](x)


_LIBRARY.impl("linear", _linear, "CPU")


@torch.library.register_fake("kit::linear")
def _(x: torch.Tensor, key: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], KERNELS[key].out_features))


opaque_linear = torch.ops.kit.linear.default


class OpaqueLinear(nn.Module):
    def __init__(self, kernel: Kernel):
        super().__init__()
        self.key = len(KERNELS)
        KERNELS[self.key] = kernel
        self.op = kernel.held(self.key) if isinstance(kernel, Held) else opaque_linear

    @property
    def kernel(self) -> Kernel:
        return KERNELS[self.key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, self.key)


def replace_linears(
    model: nn.Module, kernel_of: Callable[[nn.Linear], Kernel], dtype: torch.dtype | None = None
) -> int:
    """Every nn.Linear of the model replaced by its kernel, made from the layer in `dtype` (as loaded
    if None), its plain weight dropped (a head tied to the embedding leaves the embedding as
    loaded) and its checkpoint's pages let go as it goes (file_pages.py); how many there were."""
    # Where each one is, not the layers themselves: a replaced layer's weight is freed at the next
    # (a weight of the process's own, such as a float32 copy of a bf16 checkpoint, is not a
    # checkpoint's page: holding every replaced layer to the end held a second copy of the weights).
    # Converted a layer at a time, the largest first: the memory of its converted copy, freed, is
    # where the next layers' kernels go. The whole model converted first, the head last, a bf16
    # checkpoint served in float32 peaked with every float32 weight and the head's kernel resident
    # (2.79 against 2.28 GiB from a float32 checkpoint: docs/generation.md, "Memory of a load").
    places = sorted(
        (
            (parent, name)
            for parent in model.modules()
            for name, child in parent.named_children()
            if type(child) is nn.Linear
        ),
        key=lambda place: -getattr(*place).weight.numel(),
    )
    pages = FilePages()
    for parent, name in places:
        linear = getattr(parent, name)
        weight = linear.weight  # as loaded
        with torch.no_grad():
            served = in_dtype(linear, dtype)
            if served is not linear:
                pages.release(weight)  # converted: its pages go before the kernel's memory comes
            setattr(parent, name, OpaqueLinear(kernel_of(served)))
        # The checkpoint's pages of it: the kernel has its own copy. Not before the kernel is made
        # from them: read again, they come back with their neighbours (the kernel's read-ahead).
        pages.release(weight)
    return len(places)


def in_dtype(linear: nn.Linear, dtype: torch.dtype | None) -> nn.Linear:
    """The layer in `dtype`: itself, or a twin holding converted copies (the layer is left as it
    is: converting it in place would convert an embedding tied to it too)."""
    if dtype is None or linear.weight.dtype == dtype:
        return linear
    twin = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
    twin.weight = nn.Parameter(linear.weight.detach().to(dtype), requires_grad=False)
    if linear.bias is not None:
        twin.bias = nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)
    return twin
