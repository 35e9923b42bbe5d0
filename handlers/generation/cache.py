"""The KV cache in blocks (blocks.py says who holds which): what transformers' layers write and read.

    cache = PagedCache(KvShape.of(config), blocks=512, block_size=16, dtype=torch.float32)
    cache.select(write=torch.tensor([35, 36]), read=torch.tensor([[16, 17, ..., 36]]))
    model(input_ids, position_ids=positions, attention_mask=mask, past_key_values=cache)

Each layer's keys and values are one buffer of blocks x block_size positions, a cache slot
each. transformers' attention layers call `update(keys, values, layer)` with this step's keys
and values: token i of the step (rows flattened) is written at slot `write[i]`, and the layer
attends over `read` [rows, kv]: row r's kv positions, gathered from the slots its block table
names. Positions past a row's own length read a slot the caller's mask hides (engine.py).

The buffers are allocated at the start but not touched (calloc: the kernel maps a page when it
is first written), so the worker's memory grows with the blocks the load uses, not with the
cache's size; the blocks are handed out lowest first (blocks.py) to keep it so.
"""

from __future__ import annotations

import dataclasses
import math

import numpy
import torch

from handlers.backends import DType
from handlers.quiet_imports import torchao_import

with torchao_import():  # transformers' modeling code imports torchao when it is installed
    from transformers import PretrainedConfig
    from transformers.cache_utils import Cache

# A model's weights, activations and cache are in its served dtype.
TORCH_DTYPES = {DType.FLOAT32: torch.float32, DType.BFLOAT16: torch.bfloat16}


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

    def token_bytes(self, dtype: torch.dtype) -> int:
        """Keys and values of every layer, for one position."""
        return self.layers * 2 * self.kv_heads * self.head_size * dtype.itemsize


def row_bytes(config: PretrainedConfig, context: int, dtype: torch.dtype) -> int:
    """What one sequence of `context` positions holds: the plan's count of a sequence's KV."""
    return KvShape.of(config).token_bytes(dtype) * context


def untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros whose pages are mapped when first written: numpy's zeros are calloc's (torch's
    would write every byte, making the whole cache resident at once)."""
    raw = numpy.zeros(math.prod(shape) * dtype.itemsize, dtype=numpy.uint8)
    return torch.from_numpy(raw).view(dtype).view(shape)


class PagedCache(Cache):
    def __init__(self, shape: KvShape, blocks: int, block_size: int, dtype: torch.dtype):
        super().__init__(layers=[])
        self.shape, self.dtype = shape, dtype
        slots = blocks * block_size
        self.keys = [untouched_zeros((slots, shape.kv_heads, shape.head_size), dtype) for _ in range(shape.layers)]
        self.values = [untouched_zeros((slots, shape.kv_heads, shape.head_size), dtype) for _ in range(shape.layers)]
        self.write = torch.zeros(1, dtype=torch.long)
        self.read = torch.zeros(1, 1, dtype=torch.long)

    def select(self, write: torch.Tensor, read: torch.Tensor) -> None:
        """What the next forward computes: its tokens' slots [tokens] (rows flattened), and the
        slots each row attends over [rows, kv]."""
        self.write, self.read = write, read

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # key_states, value_states: [rows, kv_heads, tokens, head_dim] -> [rows x tokens, kv_heads, head_dim]
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if key_states.shape[1] != keys.shape[1] or key_states.shape[3] != keys.shape[2]:
            raise ValueError(
                f"layer {layer_idx} computes keys of {key_states.shape[1]} heads x {key_states.shape[3]}, "
                f"not the {keys.shape[1]} x {keys.shape[2]} its config.json says: the kit's cache cannot hold them"
            )
        keys[self.write] = key_states.transpose(1, 2).flatten(0, 1).to(self.dtype)
        values[self.write] = value_states.transpose(1, 2).flatten(0, 1).to(self.dtype)
        # [rows, kv, kv_heads, head_dim] -> [rows, kv_heads, kv, head_dim]
        return keys[self.read].transpose(1, 2), values[self.read].transpose(1, 2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.read.shape[-1]

    @property
    def is_compileable(self) -> bool:
        return True

    @property
    def bytes(self) -> int:
        """The cache's size (its resident part is what the blocks in use have touched)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))
