"""A language model's linear weights in int8, computed in the model's dtype.

    count = int8_weights(model, torch.float32)    # before torch.compile; a layer converted at a time

torchao quantizes each weight (`Int8WeightOnlyConfig`: symmetric, a scale per output channel,
round to nearest): a layer stores half of bfloat16's bytes, a quarter of float32's, and its
answers move by the rounding, which the accuracy guard measures before serving
(handlers/generation/agreement.py). A head tied to the embedding gets its own int8 copy; the
embedding reads its rows from the checkpoint's file (file_embedding.py).

How a layer multiplies is chosen at each call by the rows it is given (linears.py):
- a few rows (a decode step): `_weight_int8pack_mm` reads each int8 weight once per row and
  scales the sums. Its time is the weights' bytes, but it grows with every row.
- more rows (a prompt): the int8 weight converted to the model's dtype a block at a time, each
  block multiplied by all the rows while it is in the cache, which costs little more per row but
  pays for the conversion.
Where one overtakes the other depends on the CPU's matrix units and the layer's shape: measured
for each shape when the model is quantized, in the worker, on its threads.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import torch
from torch import nn

from handlers.generation.linears import replace_linears

log = logging.getLogger(__name__)

# The crossover is searched up to this many rows; past it a layer converts (a prompt's chunk).
MOST_ROWS = 256
# A weight is quantized this many elements at a time (whole rows): torchao's temporaries are a few
# float copies of what it is given, about 1 GiB for Qwen2.5-0.5B's 151,936 x 896 head at once. In
# blocks, in the model's order, that model's int8 load peaked at 2.01 GiB; whole, with the head
# quantized last, at 2.55 GiB (in-process, tcmalloc, the guard's answers read from the archive).
ROWS_ELEMENTS = 1 << 22
# Many rows multiply a converted weight, this many elements of it at a time (8 MB in float32): the
# block is used while it is in the CPU's cache, where a whole converted weight was written to memory
# and read back. Qwen2.5-0.5B's shapes, 2 threads, tcmalloc, medians of 3 rounds in turns on an
# AVX2 EPYC: one decode step's linear layers 96 (94-100) against 146 (141-146) ms for one row, 274
# (259-281) against 363 (345-428) ms for 16; its 151,936 x 896 head 24 against 62 ms for one row,
# 83 against 155 ms for 16, and no 545 MB copy.
CONVERT_ELEMENTS = 1 << 21


@dataclasses.dataclass(frozen=True)
class Int8:
    weight: torch.Tensor  # int8, (out_features, in_features)
    scale: torch.Tensor  # one per output channel, in the model's dtype
    bias: torch.Tensor | None
    out_features: int
    few_rows: int = 0  # up to this many rows, `_weight_int8pack_mm`; past it, converted

    @classmethod
    def of(cls, linear: nn.Linear) -> Int8:
        """The layer's weight quantized by torchao (`Int8WeightOnlyConfig`), ROWS_ELEMENTS at a
        time: each output channel is quantized on its own, so the blocks give the whole's numbers,
        and the temporaries are a block's."""
        from torchao.quantization import Int8WeightOnlyConfig, quantize_  # torchao's import costs seconds

        weight = linear.weight.detach()
        qdata = torch.empty(weight.shape, dtype=torch.int8)
        scale = torch.empty(weight.shape[0], dtype=weight.dtype)
        step = max(1, ROWS_ELEMENTS // weight.shape[1])
        for start in range(0, weight.shape[0], step):
            rows = nn.Linear(weight.shape[1], min(step, weight.shape[0] - start), bias=False, device="meta")
            rows.weight = nn.Parameter(weight[start : start + step], requires_grad=False)
            quantize_(rows, Int8WeightOnlyConfig())
            qdata[start : start + step] = rows.weight.qdata
            scale[start : start + step] = rows.weight.scale.reshape(-1)
        bias = None if linear.bias is None else linear.bias.detach().clone()  # not a view of the checkpoint
        return cls(qdata, scale, bias, linear.out_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = self.per_row(rows) if rows.shape[0] <= self.few_rows else self.converted(rows)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def per_row(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(rows, self.weight, self.scale)

    def converted(self, rows: torch.Tensor) -> torch.Tensor:
        """A block of CONVERT_ELEMENTS weights converted at a time, multiplied while in the cache."""
        out = rows.new_empty(rows.shape[0], self.out_features)
        step = max(1, CONVERT_ELEMENTS // self.weight.shape[1])
        for start in range(0, self.out_features, step):
            block = slice(start, start + step)
            out[:, block] = torch.mm(rows, self.weight[block].t().to(rows.dtype)) * self.scale[block]
        return out

    def seconds(self, rows: int) -> tuple[float, float]:
        """Each way's best time of a few calls on `rows` rows: (per row, converted)."""
        x = torch.randn(rows, self.weight.shape[1], dtype=self.scale.dtype)
        return best_seconds(lambda: self.per_row(x)), best_seconds(lambda: self.converted(x))


def best_seconds(call: Callable[[], object], repeats: int = 3) -> float:
    call()  # the first call allocates and warms the caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)  # the least disturbed


def few_rows(seconds: Callable[[int], tuple[float, float]], most: int = MOST_ROWS) -> int:
    """The most rows (a power of two, up to `most`; 0 for none) for which the per-row way is no
    slower, doubling from one row until converting wins."""
    rows, few = 1, 0
    while rows <= most:
        per_row, converted = seconds(rows)
        if per_row > converted:
            break
        few, rows = rows, rows * 2
    return few


def int8_weights(model: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Every nn.Linear's weight in int8, its scales and products in `dtype` (the weights' as
    loaded if None); how many there were."""
    measured: dict[tuple[int, ...], int] = {}

    def kernel(linear: nn.Linear) -> Int8:
        # A layer at a time: its float weight's pages are let go before the next is quantized.
        int8 = Int8.of(linear)
        shape = tuple(int8.weight.shape)
        if shape not in measured:
            with torch.inference_mode():  # the timed calls only: the kernel's tensors stay ordinary
                measured[shape] = few_rows(int8.seconds)
        return dataclasses.replace(int8, few_rows=measured[shape])

    count = replace_linears(model, kernel, dtype)
    log.info(
        "int8 weights: `_weight_int8pack_mm` up to this many rows, the weight converted past them (measured): %s",
        ", ".join(f"{out}x{inp} {few}" for (out, inp), few in measured.items()),
    )
    return count
