"""The KV cache: a row of positions per sequence in flight, allocated untouched, read as views.

    cache = SlotCache(KvShape.of(config), slots=16, context=2048, dtype=torch.float32)
    cache.select(rows=slice(0, 4), positions=torch.tensor([[17], [3], [0], [40]]), kv_length=64)
    model(input_ids, position_ids=positions, attention_mask=mask, past_key_values=cache)

transformers' attention layers call `update(keys, values, layer)` with this step's keys and values
and attend over what it returns. Each row writes at its own positions (sequences of different
lengths share one forward), and the layers attend over the first `kv_length` positions of the
selected rows: views of the buffers, never a copy (a gather from scattered blocks, tried, made a
compiled decode step of 16 sequences over twice as long, Qwen3-0.6B's shape on a 2-core EPYC,
one run each way: far past the ±20 % between runs). Positions past a row's own length
hold stale values; the caller's mask hides them (runner.py). Past the context is one position
more, the scratch position, where a row with nothing to compute writes, so that what a free row
holds (a prefix for the prefix cache, prefix.py) is never overwritten by another's step.

Keys are one tensor [layers, slots, kv_heads, positions, head_size], values another, a layer's a
view of them: a compiled forward then has two cache inputs, not two a layer, and each start
traces and guards two (Qwen2.5-0.5B's shape restarting with its graphs in the Inductor cache:
READY after 58 s against 78 s with a tensor a layer, medians of 3 rounds in turns;
docs/generation.md, "Start").

The buffers are mapped at the start but not touched (an anonymous mapping: the kernel maps a
page when it is first written), so the worker's memory grows with the positions the load uses,
not with the cache's size, whichever allocator the worker preloads; `release` gives a row's
pages back (kv_budget.py keeps what is resident within the memory plan's budget).

An int8 cache (`int8=True`, the `kv_cache: int8` setting) holds int8 keys and values and a
float32 scale per head and position beside them, [layers, slots, kv_heads, positions, 1]; a
layer reads what it attends to back in the states' dtype (a copy, where the float cache's are
views).
"""

from __future__ import annotations

import dataclasses
import math
import mmap

import torch

from handlers.backends import DType
from handlers.quiet_imports import torchao_import

with torchao_import():  # transformers' modeling code imports torchao when it is installed
    from transformers import PretrainedConfig
    from transformers.cache_utils import Cache

# A model's weights, activations and cache are in its served dtype.
TORCH_DTYPES = {DType.FLOAT32: torch.float32, DType.BFLOAT16: torch.bfloat16}
SCALE_DTYPE = torch.float32  # an int8 cache's scales: one per head and position


@dataclasses.dataclass(frozen=True)
class KvShape:
    """What one position of a sequence holds in every layer, as the model's attention computes it."""

    layers: int
    kv_heads: int
    head_size: int

    @classmethod
    def of(cls, config: PretrainedConfig) -> KvShape:
        text = config.get_text_config()
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        head_size = getattr(text, "head_dim", None) or text.hidden_size // heads
        return cls(text.num_hidden_layers, kv_heads, head_size)

    def token_bytes(self, dtype: torch.dtype, int8: bool = False, side: int = SCALE_DTYPE.itemsize) -> int:
        """Keys and values of every layer, for one position (`int8`: a byte an element and `side`
        bytes a head beside them, this cache's float32 scale by default)."""
        element = self.head_size + side if int8 else self.head_size * dtype.itemsize
        return self.layers * 2 * self.kv_heads * element


def row_bytes(
    config: PretrainedConfig, context: int, dtype: torch.dtype, int8: bool = False, side: int = SCALE_DTYPE.itemsize
) -> int:
    """What one sequence of `context` positions holds: the plan's count of a sequence's KV."""
    return KvShape.of(config).token_bytes(dtype, int8, side) * context


def quantized(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 states [..., head_size] and their scales [..., 1]: each head's vector at a position
    rounded to 1/127 of its largest magnitude (its own scale: one outlying token or head costs
    no other its precision)."""
    scale = states.abs().amax(-1, keepdim=True).float() / 127
    ints = torch.where(scale > 0, states.float() / scale, 0.0).round().clamp(-127, 127)
    return ints.to(torch.int8), scale


def dequantized(ints: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (ints.float() * scales).to(dtype)


def untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, mmap.mmap]:
    """Zeros whose pages are mapped when first written, and their mapping (an anonymous private
    one of their own, which the kernel fills with zeros page by page; its pages can be given
    back). Not the allocator's: torch's zeros write every byte, and tcmalloc's calloc (the
    workers preload it) does too, making a whole cache resident at once (806 MB of
    Qwen2.5-0.5B's 16 x 2048 positions before the first request)."""
    size = math.prod(shape) * dtype.itemsize
    mapping = mmap.mmap(-1, max(1, size), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # Pages of 4 KiB, whatever the host's transparent huge pages: where they are `always` (RHEL's
    # default), a first write would make 2 MiB resident, the rows of other sequences and layers
    # with it, and the whole cache would soon be.
    mapping.madvise(mmap.MADV_NOHUGEPAGE)
    raw = torch.frombuffer(mapping, dtype=torch.uint8)[:size]  # the tensor holds the mapping
    return raw.view(dtype).view(shape), mapping


def give_back(mapping: mmap.mmap, start: int, length: int) -> None:
    """The whole pages within bytes [start, start + length) of the mapping returned to the system:
    read as zeros afterwards, resident again when written."""
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (start + length) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > first:
        mapping.madvise(mmap.MADV_DONTNEED, first, end - first)


class SlotCache(Cache):
    def __init__(self, shape: KvShape, slots: int, context: int, dtype: torch.dtype, int8: bool = False):
        super().__init__(layers=[])
        self.shape, self.slots, self.context, self.dtype, self.int8 = shape, slots, context, dtype, int8
        size = (shape.layers, slots, shape.kv_heads, context + 1, shape.head_size)  # and the scratch position
        self.keys, key_mapping = untouched_zeros(size, torch.int8 if int8 else dtype)
        self.values, value_mapping = untouched_zeros(size, torch.int8 if int8 else dtype)
        mappings = [(self.keys, key_mapping), (self.values, value_mapping)]
        if int8:  # a scale per head and position, beside them
            self.key_scales, key_scale_mapping = untouched_zeros((*size[:-1], 1), SCALE_DTYPE)
            self.value_scales, value_scale_mapping = untouched_zeros((*size[:-1], 1), SCALE_DTYPE)
            mappings += [(self.key_scales, key_scale_mapping), (self.value_scales, value_scale_mapping)]
        self._mappings = tuple(mappings)
        # Each layer's index a tensor of its own, read by the compiled kernels when they run: as a
        # constant it is part of their source, and each layer's kernels were compiled again (98 C++
        # compiles for Qwen2.5-0.5B's 24 layers, against 5).
        self.layer_index = [torch.full((1, 1), layer, dtype=torch.long) for layer in range(shape.layers)]
        self.rows = slice(0, slots)
        self.row_index = torch.arange(slots)[:, None]
        self.positions = torch.zeros(slots, 1, dtype=torch.long)
        self.kv_length = context

    def __getstate__(self) -> dict:
        """Without the mappings, which are this process's: torch pickles the objects a whole graph
        was traced with (precompiled.py), for their structure."""
        return {name: value for name, value in self.__dict__.items() if name != "_mappings"}

    @property
    def scratch(self) -> int:
        """The position a row writes at when it has nothing to compute (never read)."""
        return self.context

    def select(self, rows: slice, positions: torch.Tensor, kv_length: int) -> None:
        """What the next forward computes: these slots, at these positions [rows, tokens], attending
        over the first kv_length positions."""
        self.rows, self.positions, self.kv_length = rows, positions, kv_length
        self.row_index = torch.arange(rows.start, rows.stop)[:, None]

    def select_tokens(self, slots: torch.Tensor, positions: torch.Tensor, kv_length: int) -> None:
        """A forward of one row whose tokens go to several slots (attention.Mixed): token i to
        slot slots[0, i] at positions[0, i]; layers get every slot's first kv_length positions."""
        self.rows, self.row_index, self.positions, self.kv_length = slice(0, self.slots), slots, positions, kv_length

    def copy(self, source: int, target: int, positions: slice) -> None:
        """Row `source`'s keys and values at `positions` written into row `target` (a prefix found
        in another row)."""
        for tensor, _ in self._mappings:
            tensor[:, target, :, positions] = tensor[:, source, :, positions]

    def block(self, slot: int, positions: slice) -> tuple[torch.Tensor, ...]:
        """A copy of what the slot's row holds at `positions` in every layer (keys, values, an
        int8 cache's scales): prefix_store.py keeps it when the row is taken."""
        return tuple(tensor[:, slot, :, positions].clone() for tensor, _ in self._mappings)

    def put_block(self, slot: int, positions: slice, saved: tuple[torch.Tensor, ...]) -> None:
        """`block`'s copy written back, into the slot's row at `positions`."""
        for (tensor, _), held in zip(self._mappings, saved, strict=True):
            tensor[:, slot, :, positions] = held

    def release(self, slot: int) -> None:
        """The slot's row of every layer given back to the system (release's callers forget what
        it held: it reads as zeros). A layer's row is one span of the buffer: 2 x layers calls."""
        for tensor, mapping in self._mappings:
            span = tensor[0, slot].numel() * tensor.element_size()
            for layer in range(self.shape.layers):
                give_back(mapping, tensor[layer, slot].data_ptr() - tensor.data_ptr(), span)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # key_states, value_states: [rows, kv_heads, tokens, head_dim]
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if key_states.shape[1] != keys.shape[1] or key_states.shape[3] != keys.shape[3]:
            raise ValueError(
                f"layer {layer_idx} computes keys of {key_states.shape[1]} heads x {key_states.shape[3]}, "
                f"not the {keys.shape[1]} x {keys.shape[3]} its config.json says: the kit's cache cannot hold them"
            )
        # [rows, 1] (or [1, tokens]) and [rows, tokens] index [rows, tokens, kv_heads, head_dim]
        # One write into the whole buffer, the layer an index like the others: written into the
        # layer's view instead, the compiled forward copied the whole buffer (Qwen2.5-0.5B's
        # shape: a 1.5 s decode step, not 0.13 s).
        layer = self.layer_index[layer_idx]
        if not self.int8:
            self.keys[layer, self.row_index, :, self.positions] = key_states.transpose(1, 2).to(self.dtype)
            self.values[layer, self.row_index, :, self.positions] = value_states.transpose(1, 2).to(self.dtype)
            return keys[self.rows, :, : self.kv_length], values[self.rows, :, : self.kv_length]
        # int8: written with their scales; read back as the states' dtype (a copy of the attended
        # positions, where the float cache's are views), this step's own positions too.
        attended = []
        for states, ints, scales in (
            (key_states, self.keys, self.key_scales),
            (value_states, self.values, self.value_scales),
        ):
            ints[layer, self.row_index, :, self.positions], scales[layer, self.row_index, :, self.positions] = (
                quantized(states.transpose(1, 2))
            )
            read = (self.rows, slice(None), slice(0, self.kv_length))
            attended.append(dequantized(ints[layer_idx][read], scales[layer_idx][read], states.dtype))
        return attended[0], attended[1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_length

    @property
    def is_compileable(self) -> bool:
        return True

    @property
    def bytes(self) -> int:
        """The cache's size (its resident part is what the load has written)."""
        return sum(tensor.numel() * tensor.element_size() for tensor, _ in self._mappings)
