"""A language model's linear layers on the kit's own kernels for a few rows (row_kernels.cpp).

    if (isa := row_kernels_for(torch.bfloat16)) is not None:        # this CPU, this dtype, the library built
        count = row_linears(model, torch.bfloat16, isa, Packed.of)  # before torch.compile; a shape they
                                                                    # do not take on the fallback's kernel

A decode step's time is its weights' bytes read from memory. oneDNN's packed product
(packed_linear.py) read them at 0.6-0.8 of a plain read's rate for one to sixteen rows; these
kernels read at a plain read's rate for one row and stay ahead up to 16, level at 64 and 256 (a
prompt's part). Qwen2.5-0.5B's 96 projections of 24 layers, 2 threads, in one process, medians of
7 rounds on a 2-core AMD EPYC (AVX-512 BF16, no AMX): bf16 one row 23.0 against 33.6 ms, 4 rows
24.5 against 32.7, 16 rows 41.3 against 48.4, 64 rows 120 against 122; float32 one row 44.8
against 61.0, 16 rows 73.2 against 79.7, 256 rows 883 against 877. Served, `make bench-decode`
measures a decode step (docs/generation.md). The weight is held once, in the kernels' layout,
for every row count: no second copy for prompts.

Where AMX multiplies bf16, four rows and more run on its tiles from the same layout (a block's
lines of sixteen pairs are the operand a tile multiply reads), one to three rows on AVX-512's dot
products. On a 2-core Intel Xeon with AMX (KVM, family 6 model 167 as reported), the same
projections in bf16, medians of 7: one row 26.4 against oneDNN's 37.2 ms, 4 rows 29.3 against 33.8,
16 rows 29.9 against 35.8, 64 rows 40.5 against 46.3, 256 rows 101 against 94 (AVX-512 alone: 73 ms
at 16 rows, 904 at 256).

On CPUs with AVX2 but not AVX-512 (EPYCs before Zen 4) float32 runs on the same layout with 256-bit
kernels (bf16 is not served there): on the same EPYC with oneDNN held to AVX2
(ONEDNN_MAX_CPU_ISA=AVX2; not measured on an AVX2-only CPU), one row 53 against 77 ms, 16 rows 76
against 102, 256 rows 865 against 909.

The kernels are compiled and loaded with the kit's others (native.py); where they cannot be, the
layers stay on oneDNN.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
from collections.abc import Callable

import torch
from torch import nn

from handlers.backends import cpu_flags
from handlers.generation.linears import KERNELS, Kernel, replace_linears
from handlers.generation.native import library

log = logging.getLogger(__name__)

LANES = 16  # output channels a block holds (row_kernels.cpp)


class Isa(enum.IntEnum):
    """The instruction set a kernel runs on (row_kernels.cpp's `Isa`, by number)."""

    AVX512 = 1
    AVX2 = 2
    AMX = 3  # AVX-512's for up to three rows, AMX's tiles for more


# Each dtype's kernels, the first whose instructions the CPU has taken.
NEEDS: dict[torch.dtype, tuple[tuple[Isa, frozenset[str]], ...]] = {
    torch.float32: ((Isa.AVX512, frozenset({"avx512f"})), (Isa.AVX2, frozenset({"avx2", "fma"}))),
    torch.bfloat16: (
        (Isa.AMX, frozenset({"avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"})),
        (Isa.AVX512, frozenset({"avx512f", "avx512bw", "avx512_bf16"})),
    ),
}


@dataclasses.dataclass(frozen=True)
class Rows:
    weight: torch.Tensor  # [N/16][K][16] float32 or [N/16][K/2][16][2] bfloat16: row_kernels.cpp
    bias: torch.Tensor | None
    out_features: int
    isa: Isa

    @classmethod
    def of(cls, linear: nn.Linear, isa: Isa) -> Rows:
        bias = None if linear.bias is None else linear.bias.detach().clone()  # not a view of the checkpoint
        return cls(torch.ops.kit_rows.pack(linear.weight.detach()), bias, linear.out_features, isa)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _linear()(x, self.weight, self.bias, self.isa.value)

    def held(self, key: int) -> torch._ops.OpOverload:
        """The library's operator for this layer under `key`, which now holds it (linears.Held)."""
        _register_fake()
        torch.ops.kit_rows.hold(key, self.weight, self.bias, self.isa.value)
        return torch.ops.kit_rows.keyed_linear.default


def fits(linear: nn.Linear) -> bool:
    """Whether the kernels take this layer's shape: outputs in blocks of 16, bf16 inputs in pairs."""
    pairs = 2 if linear.weight.dtype == torch.bfloat16 else 1
    return linear.out_features % LANES == 0 and linear.in_features % pairs == 0


def row_kernels_for(dtype: torch.dtype, flags: frozenset[str] | None = None) -> Isa | None:
    """The instruction set this CPU's linear layers in `dtype` run on with the kit's kernels; None
    where they stay on oneDNN (or the library does not load)."""
    flags = cpu_flags() if flags is None else flags
    offered = [isa for isa, needs in NEEDS.get(dtype, ()) if needs <= flags]
    if not offered or library() is None:
        return None
    return next((isa for isa in offered if granted(isa)), None)


def granted(isa: Isa) -> bool:
    """Whether this process may run `isa`: Linux hands out AMX's tile state only when asked, and a
    kernel or a container's seccomp may refuse (the next instruction set then serves, said here)."""
    if isa is not Isa.AMX:
        return True
    if torch.ops.kit_rows.tiles_permitted():
        return True
    log.warning("the CPU has AMX but Linux refused this process its tiles (arch_prctl): bf16 rows on AVX-512")
    return False


def row_linears(model: nn.Module, dtype: torch.dtype, isa: Isa, fallback: Callable[[nn.Linear], Kernel]) -> int:
    """Every nn.Linear of the model on the kit's kernels in `dtype` on `isa`, a layer they do not
    fit on `fallback`'s kernel (packed_linear.Packed.of); how many there were."""
    return replace_linears(model, lambda linear: Rows.of(linear, isa) if fits(linear) else fallback(linear), dtype)


@functools.cache
def _register_fake() -> None:
    """A held layer's output for the compiler's traces: its kernel's out_features (once the
    library is loaded)."""
    torch.library.register_fake("kit_rows::keyed_linear")(
        lambda x, key: x.new_empty((*x.shape[:-1], KERNELS[key].out_features))
    )


@functools.cache
def _linear() -> torch._ops.OpOverload:
    """The overload resolved once, as packed_linear's: a decode step calls it for every layer."""
    return torch.ops.kit_rows.linear.default
