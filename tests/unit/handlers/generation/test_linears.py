"""handlers/generation/linears.py: a model's linear layers behind an operator the compiler does not
look into, each calling its kernel with the rows of that call."""

from __future__ import annotations

import dataclasses
import weakref

import torch
from torch import nn

from handlers.generation.linears import KERNELS, OpaqueLinear, replace_linears


@dataclasses.dataclass(frozen=True)
class RowCounter:
    """A kernel that computes the plain product and notes how many rows each call had."""

    linear: nn.Linear
    rows: list[int]

    @property
    def out_features(self) -> int:
        return self.linear.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.rows.append(x.reshape(-1, x.shape[-1]).shape[0])
        return self.linear(x)


def test_a_compiled_model_calls_each_kernel_with_each_calls_rows():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4)))
    plain = [m for m in model.modules() if type(m) is nn.Linear]
    counters = []
    assert replace_linears(model, lambda linear: counters.append(RowCounter(linear, [])) or counters[-1]) == 2
    assert [type(m) for m in (model[0], model[2][0])] == [OpaqueLinear, OpaqueLinear]
    assert [KERNELS[m.key] for m in (model[0], model[2][0])] == counters
    torch._dynamo.reset()  # nn.Sequential's forward: Dynamo's 8 entries are shared with other tests' models
    compiled = torch.compile(model, dynamic=True)
    with torch.inference_mode():
        for rows in (3, 1, 6):
            x = torch.randn(rows, 8)
            assert torch.equal(compiled(x), plain[1](torch.relu(plain[0](x))))
    # Compiled once for every row count, each call reaching the kernel with its own rows.
    assert [c.rows[-3:] for c in counters] == [[3, 1, 6], [3, 1, 6]]


@dataclasses.dataclass(frozen=True)
class Shape:
    """A kernel that holds nothing of its layer (the layer's weight is freed once replaced)."""

    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros((*x.shape[:-1], self.out_features))


def test_each_replaced_layers_weight_is_freed_before_the_next_is_replaced():
    """Weights of the process's own (a float32 copy of a bf16 checkpoint, a bf16 copy of a float32
    one) are no checkpoint's pages to let go: a replaced layer must not be held to the end, or
    every plain weight and every kernel are resident at once."""
    model = nn.Sequential(*(nn.Linear(64, 64) for _ in range(4)))
    weights: list = []
    alive: list[int] = []

    def kernel(linear: nn.Linear) -> Shape:
        alive.append(sum(ref() is not None for ref in weights))
        weights.append(weakref.ref(linear.weight))
        return Shape(linear.out_features)

    assert replace_linears(model, kernel) == 4
    assert alive == [0, 0, 0, 0]


def test_layers_converted_one_at_a_time_the_largest_first_leave_a_tied_table_as_loaded():
    """Each kernel is made from the layer in the served dtype; an embedding tied to a layer keeps
    its loaded dtype and storage (it is read from the file later, not converted whole)."""
    model = nn.Sequential(nn.Embedding(32, 8), nn.Linear(8, 4), nn.Linear(8, 32, bias=False))
    model.to(torch.bfloat16)
    model[2].weight = model[0].weight  # a head tied to the embedding
    table = model[0].weight
    seen = []

    def kernel(linear: nn.Linear) -> Shape:
        seen.append((tuple(linear.weight.shape), linear.weight.dtype))
        return Shape(linear.out_features)

    assert replace_linears(model, kernel, torch.float32) == 2
    assert seen == [((32, 8), torch.float32), ((4, 8), torch.float32)]  # the head first: the largest
    assert model[0].weight is table and table.dtype == torch.bfloat16
