"""The engine's attention over its slot cache: transformers' sdpa, shaped for the steps engine.py
computes. Registered with transformers' AttentionInterface as NAME; `use(model)` sets it.

    use(model)
    model(input_ids=ids, ..., past_key_values=cache, mixed=Mixed(decode_mask, part_mask, part_slot))

It differs from transformers' sdpa in two ways.

Grouped-query heads read their key/value head where it is. Llama-style models share each key/value
head between several query heads (Qwen2.5-0.5B: 14 over 2). Under torch.compile, transformers
repeats the keys and values once per query head: a copy of every attended cache row, each layer,
each step. For a decode row, the heads of a group become query positions of their one key/value
head instead (transformers does this too, but only uncompiled). A prompt's query is
[heads, tokens]; it attends with sdpa's enable_gqa.

A decode row's attention runs on the kit's kernel (decode_attention.cpp) where it can: sdpa's CPU
kernel calls a blocked GEMM per (row, head), 2-4x slower on a decode step's shapes.

A mixed step is one forward of decode rows and a prompt's part (`Mixed`). Decode rows are [R, 1]
tokens and a part is [1, C]: the step flattens them into one row of R + C tokens, so every
projection and MLP reads its weights once for both (a decode step's cost on CPU is mostly that
read). Only attention is split: the first R queries are R decode rows, each over its own cache
row; the others are the part over its slot's row.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn
from torch.nn import functional

from handlers.backends import cpu_flags
from handlers.generation import native
from handlers.quiet_imports import torchao_import

with torchao_import():  # transformers' modeling code imports torchao when it is installed
    from transformers import AttentionInterface, PreTrainedModel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "kit_slots"


@dataclasses.dataclass(frozen=True)
class Mixed:
    """A mixed step's layout: shapes say where decode rows end and how far each part attends."""

    decode_mask: torch.Tensor  # [R, 1, 1, kv]: row r's first kv cache positions, True where attended
    part_mask: torch.Tensor  # [1, 1, C, kv']: the part's C tokens over its slot's first kv' positions
    part_slot: torch.Tensor  # [1]: the part's slot


# The dtypes whose decode rows attend on the kit's kernel: set by `use` before any forward is
# traced (a constant to the compiler); empty where the kernel cannot run (sdpa then).
DECODE_DTYPES: frozenset[torch.dtype] = frozenset()


def use(model: PreTrainedModel) -> bool:
    """Compute `model`'s attention here; False where its attention is not transformers' pluggable
    kind (it is then left as it is, and engine.py computes no mixed step for it)."""
    global DECODE_DTYPES
    DECODE_DTYPES = decode_kernel_dtypes()
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME


def decode_kernel_dtypes(flags: frozenset[str] | None = None) -> frozenset[torch.dtype]:
    """The dtypes decode_attention.cpp computes on this CPU: its code is AVX-512's."""
    flags = cpu_flags() if flags is None else flags
    if "avx512f" not in flags or native.library() is None:
        return frozenset()
    _register_fake()
    return frozenset({torch.float32, torch.bfloat16})


@functools.cache
def _register_fake() -> None:
    """The kernel's output for the compiler's traces: the query's shape (once the library is loaded)."""
    torch.library.register_fake("kit_rows::decode_attention")(
        lambda query, key, value, mask, scale: torch.empty_like(query, memory_format=torch.contiguous_format)
    )


def attention(
    module: nn.Module,
    query: torch.Tensor,  # [batch, heads, tokens, head_dim]
    key: torch.Tensor,  # [batch, kv_heads, kv, head_dim]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,  # [batch, 1, tokens, kv], bool
    scaling: float | None = None,
    mixed: Mixed | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Returns [batch, tokens, heads, head_dim], as transformers' attention functions do."""
    if kwargs.get("softcap") is not None:
        # Gemma 2's logit soft-capping: sdpa has none either; refused at warm-up, not answered wrong.
        raise ValueError(f"{type(module).__name__} caps its attention logits (softcap); the kit's attention does not")
    if attention_mask is None:
        # Not the engine's (which always masks): transformers' own, e.g. generate() on the model.
        return sdpa_attention_forward(module, query, key, value, None, scaling=scaling, **kwargs)
    # A model attribute, so a constant to the compiler (shapes are symbols: a grouping read from
    # them would be a symbolic bool, which sdpa's enable_gqa does not take).
    group = getattr(module, "num_key_value_groups", 1)
    if mixed is None:
        return _attend(query, key, value, attention_mask, scaling, group), None
    rows = mixed.decode_mask.shape[0]
    decode_kv, part_kv = mixed.decode_mask.shape[-1], mixed.part_mask.shape[-1]
    # [1, heads, R, d] -> [R, heads, 1, d]: a row each, over its own slot's cache row
    decode = _attend(
        query[0, :, :rows, None].transpose(0, 1),
        key[:rows, :, :decode_kv],
        value[:rows, :, :decode_kv],
        mixed.decode_mask,
        scaling,
        group,
    )
    part = _attend(
        query[:, :, rows:],
        key[:, :, :part_kv].index_select(0, mixed.part_slot),
        value[:, :, :part_kv].index_select(0, mixed.part_slot),
        mixed.part_mask,
        scaling,
        group,
    )
    return torch.cat([decode.transpose(0, 1), part], dim=1), None  # [1, R + C, heads, d]


def _attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    group: int,
) -> torch.Tensor:
    """sdpa over key/value heads shared by `group` query heads each; [batch, tokens, heads, d]."""
    batch, heads, tokens, size = query.shape
    if (
        tokens == 1
        and query.dtype in DECODE_DTYPES
        and size % 16 == 0
        and mask is not None
        and mask.dtype == torch.bool
    ):
        # Decode rows on the kit's kernel (decode_attention.cpp): a group's heads read their key
        # and value once, no blocked GEMM per (row, head).
        grouped = query.reshape(batch, heads // group, group, size)
        out = torch.ops.kit_rows.decode_attention(grouped, key, value, mask, size**-0.5 if scaling is None else scaling)
        return out.reshape(batch, heads, 1, size).transpose(1, 2)
    if tokens == 1 and group > 1:
        # A decode row: the group's heads are query positions of their key/value head.
        grouped = query.reshape(batch, heads // group, group, size)
        out = functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scaling)
        return out.reshape(batch, heads, 1, size).transpose(1, 2)
    out = functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, enable_gqa=group > 1
    )
    return out.transpose(1, 2)


AttentionInterface.register(NAME, attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # masks the model makes itself: sdpa's
