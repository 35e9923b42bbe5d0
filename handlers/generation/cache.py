"""A KV cache of fixed slots, allocated once: one row per sequence in flight, `context` positions each.

    cache = SlotCache(slots=8, context=2048, dtype=torch.float32)
    cache.select(rows=slice(0, 4), positions=torch.tensor([[17], [3], [0], [40]]), kv_length=64)
    model(input_ids, position_ids=positions, attention_mask=mask, past_key_values=cache)

transformers' attention layers call `update(keys, values, layer)` with this step's keys and values
and attend over what it returns. Each row writes at its own positions (sequences of different
lengths share one forward), and the layers attend over the first `kv_length` positions of the
selected rows: views of the buffers, never a copy. Positions past a row's own length hold stale
values; the caller's mask hides them (engine.py), and the row's next tokens overwrite them.
The buffers take their shape from the first update (kv heads and head size as the model computes
them), which the engine's warm-up makes before serving.
"""

from __future__ import annotations

import torch

from handlers.backends import DType
from handlers.quiet_imports import torchao_import

with torchao_import():  # transformers' modeling code imports torchao when it is installed
    from transformers import PretrainedConfig
    from transformers.cache_utils import Cache

# A model's weights, activations and cache are in its served dtype.
TORCH_DTYPES = {DType.FLOAT32: torch.float32, DType.BFLOAT16: torch.bfloat16}


def row_bytes(config: PretrainedConfig, context: int, dtype: torch.dtype) -> int:
    """What one sequence's row of a SlotCache holds: keys and values of every layer, as the
    model's attention computes them (kv heads x head size), for `context` positions."""
    text = config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_size = getattr(text, "head_dim", None) or text.hidden_size // heads
    return text.num_hidden_layers * 2 * kv_heads * head_size * context * dtype.itemsize


class SlotCache(Cache):
    def __init__(self, slots: int, context: int, dtype: torch.dtype):
        super().__init__(layers=[])
        self.slots, self.context, self.dtype = slots, context, dtype
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.rows = slice(0, slots)
        self.row_index = torch.arange(slots)[:, None]
        self.positions = torch.zeros(slots, 1, dtype=torch.long)
        self.kv_length = context

    def select(self, rows: slice, positions: torch.Tensor, kv_length: int) -> None:
        """What the next forward computes: these slots, at these positions [rows, tokens], attending
        over the first kv_length positions."""
        self.rows, self.positions, self.kv_length = rows, positions, kv_length
        self.row_index = torch.arange(rows.start, rows.stop)[:, None]

    def select_tokens(self, slots: torch.Tensor, positions: torch.Tensor, kv_length: int) -> None:
        """A forward of one row whose tokens go to several slots (attention.Mixed): token i to
        slot slots[0, i] at positions[0, i]; layers get every slot's first kv_length positions."""
        self.rows, self.row_index, self.positions, self.kv_length = slice(0, self.slots), slots, positions, kv_length

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # key_states, value_states: [rows, kv_heads, tokens, head_dim]
        if layer_idx == len(self.keys):
            shape = (self.slots, key_states.shape[1], self.context, key_states.shape[3])
            self.keys.append(torch.zeros(shape, dtype=self.dtype))
            self.values.append(torch.zeros(shape, dtype=self.dtype))
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        # [rows, 1] (or [1, tokens]) and [rows, tokens] index [rows, tokens, kv_heads, head_dim]
        keys[self.row_index, :, self.positions] = key_states.transpose(1, 2).to(self.dtype)
        values[self.row_index, :, self.positions] = value_states.transpose(1, 2).to(self.dtype)
        return keys[self.rows, :, : self.kv_length], values[self.rows, :, : self.kv_length]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_length

    @property
    def is_compileable(self) -> bool:
        return True

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))
