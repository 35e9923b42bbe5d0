"""A language model's linear layers on oneDNN's prepacked weights, shared by every compiled graph.

    count = pack_linears(model)    # before torch.compile; the model answers as before

A decode step reads every weight once for a few rows of activations: its time is the weights'
memory traffic. `F.linear` in bf16 hands oneDNN the plain weight, which it reorders into its
blocked (AMX) layout on every call; a weight packed once skips that. Inductor's freezing packs
weights too, but as constants of each graph: a language model compiles several graphs (prefill,
decode of one and of many rows), each with its own copy of the weights. Here each weight is
packed once, the plain one is dropped (a head tied to the embedding keeps the embedding), and
the graphs call the packed one through an operator the compiler does not look into.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class Packed:
    weight: torch.Tensor  # oneDNN's opaque layout: only mkldnn._linear_pointwise reads it
    bias: torch.Tensor | None
    out_features: int


# The compiled graphs name a weight by its key (an int): an opaque tensor cannot be a graph input.
PACKED: dict[int, Packed] = {}


@torch.library.custom_op("kit::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, key: int) -> torch.Tensor:
    packed = PACKED[key]
    return torch.ops.mkldnn._linear_pointwise(x, packed.weight, packed.bias, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, key: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], PACKED[key].out_features))


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.key = len(PACKED)
        with torch.no_grad():
            weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        bias = None if linear.bias is None else linear.bias.detach()
        PACKED[self.key] = Packed(weight, bias, linear.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.key)


def can_pack() -> bool:
    """Whether this torch has oneDNN to pack with (which dtypes to pack is the caller's choice)."""
    return torch.backends.mkldnn.is_available()


def pack_linears(model: nn.Module) -> int:
    """Every nn.Linear of the model replaced by its packed twin; how many there were."""
    linears = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) is nn.Linear]  # fmt: skip
    for parent, name, linear in linears:
        setattr(parent, name, PackedLinear(linear))
    return len(linears)
