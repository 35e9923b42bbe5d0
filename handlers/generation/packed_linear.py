"""A language model's linear layers on oneDNN's prepacked weights, shared by every compiled graph.

    count = pack_linears(model, torch.float32)    # before torch.compile; the model answers as before

A decode step reads every weight once for a few rows of activations: its time is the weights'
memory traffic. `F.linear` in bf16 hands oneDNN the plain weight, which it reorders into its
blocked (AMX) layout on every call; a weight packed once skips that. Inductor's freezing packs
weights too, but as constants of each graph, each with its own copy (linears.py).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from handlers.generation.linears import replace_linears


@dataclasses.dataclass(frozen=True)
class Packed:
    weight: torch.Tensor  # oneDNN's opaque layout: only mkldnn._linear_pointwise reads it
    bias: torch.Tensor | None
    out_features: int

    @classmethod
    def of(cls, linear: nn.Linear) -> Packed:
        weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        return cls(weight, None if linear.bias is None else linear.bias.detach().clone(), linear.out_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _linear()(x, self.weight, self.bias, "none", [], "")


@functools.cache
def _linear() -> torch._ops.OpOverload:
    """The overload resolved once: resolving it at each call (torch.ops' packet) cost 8 us of a
    call's 30 (64x64 weight, 2-core Xeon), made 169 times a decode step for Qwen2.5-0.5B's shape.
    Looked up when first called: a torch without oneDNN has no such op (can_pack)."""
    return torch.ops.mkldnn._linear_pointwise.default


def can_pack() -> bool:
    """Whether this torch has oneDNN to pack with (which dtypes to pack is the caller's choice)."""
    return torch.backends.mkldnn.is_available()


def pack_linears(model: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Every nn.Linear of the model replaced by its packed twin in `dtype` (as loaded if None);
    how many there were."""
    return replace_linears(model, Packed.of, dtype)
