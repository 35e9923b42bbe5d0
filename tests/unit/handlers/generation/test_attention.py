"""handlers/generation/attention.py against transformers' sdpa (keys and values repeated per query
head), on Qwen2.5-0.5B's heads: 14 query heads over 2 key/value heads."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from handlers.generation import attention as module
from handlers.generation.attention import Mixed, attention, decode_kernel_dtypes

HEADS, KV_HEADS, SIZE, SLOTS, KV = 14, 2, 64, 4, 40
TOLERANCE = 1e-5  # float32, the same sums in another order


class Layer(torch.nn.Module):
    num_key_value_groups = HEADS // KV_HEADS


def repeated(query, key, value, mask):
    """What transformers computes compiled: every key/value head copied for its query heads."""
    key, value = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (key, value))
    return functional.scaled_dot_product_attention(query, key, value, attn_mask=mask).transpose(1, 2)


@pytest.fixture
def cache():
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(SLOTS, KV_HEADS, KV, SIZE, generator=generator) for _ in range(2))


@pytest.fixture(params=["sdpa", "kit"])
def decode_on(request, monkeypatch):
    """Decode rows on sdpa, or on the kit's kernel (decode_attention.cpp) where this CPU runs it."""
    dtypes = frozenset() if request.param == "sdpa" else decode_kernel_dtypes()
    if request.param == "kit" and not dtypes:
        pytest.skip("the kit's decode attention needs AVX-512 and its library built")
    monkeypatch.setattr(module, "DECODE_DTYPES", dtypes)


@pytest.mark.parametrize("tokens", [1, 5])  # a decode row; a prompt's part
def test_grouped_heads_attend_as_repeated_keys_and_values(cache, tokens, decode_on):
    key, value = cache
    query = torch.randn(SLOTS, HEADS, tokens, SIZE, generator=torch.Generator().manual_seed(1))
    positions = torch.tensor([3, 17, 39, 0])[:, None] + torch.arange(tokens) - tokens + 1
    mask = (torch.arange(KV)[None, None, :] <= positions.clamp(min=0)[:, :, None])[:, None]
    out, _ = attention(Layer(), query, key, value, mask)
    assert out.shape == (SLOTS, tokens, HEADS, SIZE)
    torch.testing.assert_close(out, repeated(query, key, value, mask), atol=TOLERANCE, rtol=0)


def test_a_mixed_step_attends_each_decode_row_over_its_slot_and_the_part_over_its_own(cache, decode_on):
    key, value = cache
    rows, part, slot, part_kv, decode_kv = 3, 6, 2, 24, 32
    query = torch.randn(1, HEADS, rows + part, SIZE, generator=torch.Generator().manual_seed(2))
    decode_positions = torch.tensor([[9], [31], [4]])
    decode_mask = (torch.arange(decode_kv)[None, :] <= decode_positions)[:, None, None, :]
    part_positions = torch.arange(part_kv - part, part_kv)
    part_mask = (torch.arange(part_kv)[None, :] <= part_positions[:, None])[None, None]
    mixed = Mixed(decode_mask, part_mask, torch.tensor([slot]))
    out, _ = attention(Layer(), query, key, value, part_mask, mixed=mixed)
    decode = repeated(
        query[0, :, :rows, None].transpose(0, 1), key[:rows, :, :decode_kv], value[:rows, :, :decode_kv], decode_mask
    )
    prompt = repeated(
        query[:, :, rows:], key[slot : slot + 1, :, :part_kv], value[slot : slot + 1, :, :part_kv], part_mask
    )
    assert out.shape == (1, rows + part, HEADS, SIZE)
    torch.testing.assert_close(out[0, :rows], decode[:, 0], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(out[:, rows:], prompt, atol=TOLERANCE, rtol=0)


def test_an_attention_that_caps_its_logits_is_refused_by_name(cache):
    key, value = cache
    query = torch.randn(SLOTS, HEADS, 1, SIZE)
    mask = torch.ones(SLOTS, 1, 1, KV, dtype=torch.bool)
    with pytest.raises(ValueError, match="caps its attention logits \\(softcap\\)"):
        attention(Layer(), query, key, value, mask, softcap=30.0)
