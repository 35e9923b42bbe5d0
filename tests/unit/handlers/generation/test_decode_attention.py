"""handlers/generation/decode_attention.cpp (torch.ops.kit_rows.decode_attention): decode rows'
attention as close to float64's as sdpa's is, on cache views, any mask, grouped heads; a shape it
does not take refused by name."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from handlers.generation import native
from handlers.generation.attention import decode_kernel_dtypes

pytestmark = pytest.mark.skipif(
    not decode_kernel_dtypes(), reason="the kit's decode attention needs AVX-512 and its library built"
)


def inputs(dtype, rows, kv_heads, group, size, kv, generator, holes=False, per_head=False):
    """query [rows, kv_heads, group, size]; key and value views of a wider cache (as the engine's
    are); a mask of each row's first positions (`holes`: some positions inside left out)."""
    cache = [torch.randn(rows + 2, kv_heads, kv + 24, size, generator=generator).to(dtype) for _ in range(2)]
    key, value = (c[1 : rows + 1, :, :kv] for c in cache)
    query = torch.randn(rows, kv_heads, group, size, generator=generator).to(dtype)
    lengths = torch.randint(1, kv + 1, (rows,), generator=generator)
    mask = (torch.arange(kv)[None] < lengths[:, None])[:, None, None, :]
    if holes:
        mask = mask & (torch.rand(rows, 1, 1, kv, generator=generator) > 0.3)
        mask[:, :, :, 0] = True  # a row attends somewhere
    if per_head:
        mask = mask.expand(rows, kv_heads, 1, kv) & (torch.rand(rows, kv_heads, 1, kv, generator=generator) > 0.2)
        mask[:, :, :, 0] = True
    return query, key, value, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
@pytest.mark.parametrize(
    ("rows", "kv_heads", "group", "size", "kv"),
    [(1, 2, 7, 64, 128), (16, 2, 7, 64, 200), (3, 4, 1, 128, 37), (2, 1, 4, 16, 1), (5, 8, 2, 256, 70)],
)
@pytest.mark.parametrize("mask", ["prefix", "holes", "per-head"])
def test_decode_rows_attend_as_close_to_float64_as_sdpa(dtype, rows, kv_heads, group, size, kv, mask):
    generator = torch.Generator().manual_seed(rows * 1000 + kv)
    query, key, value, attended = inputs(
        dtype, rows, kv_heads, group, size, kv, generator, mask == "holes", mask == "per-head"
    )
    scale = size**-0.5
    exact = functional.scaled_dot_product_attention(
        query.double(), key.double(), value.double(), attn_mask=attended, scale=scale
    )
    sdpa = functional.scaled_dot_product_attention(query, key, value, attn_mask=attended, scale=scale)
    ours = torch.ops.kit_rows.decode_attention(query, key, value, attended, scale)
    assert ours.shape == query.shape and ours.dtype == dtype
    # float32: another summation order; bf16: one rounding of the output (2^-8 of its largest)
    floor = (1e-6 if dtype == torch.float32 else 2.0**-8) * exact.abs().max().item()
    assert (ours.double() - exact).abs().max() <= max(1.25 * (sdpa.double() - exact).abs().max(), floor)


def test_a_row_masked_everywhere_attends_to_nothing():
    query, key, value, mask = inputs(torch.float32, 2, 2, 3, 64, 20, torch.Generator().manual_seed(3))
    mask[1] = False
    out = torch.ops.kit_rows.decode_attention(query, key, value, mask, 0.125)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and out[0].abs().sum() > 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda q, k, v, m: (q[..., :40], k[..., :40], v[..., :40], m), "head size 40 not a multiple of 16"),
        (lambda q, k, v, m: (q, k.double(), v, m), "query, key and value of one dtype"),
        (lambda q, k, v, m: (q, k, v, m.float()), "a bool mask"),
        (lambda q, k, v, m: (q, k[:, :, :5], v[:, :, :5], m), "mask"),
        (lambda q, k, v, m: (q.half(), k.half(), v.half(), m), "float32 or bfloat16, not Half"),
    ],
)
def test_inputs_it_does_not_take_are_refused_by_name(change, message):
    args = change(*inputs(torch.float32, 2, 2, 3, 64, 20, torch.Generator().manual_seed(4)))
    with pytest.raises(RuntimeError, match=message):
        torch.ops.kit_rows.decode_attention(*args, 0.125)


def test_a_cpu_without_avx512_attends_on_sdpa(monkeypatch):
    assert decode_kernel_dtypes(frozenset({"avx2", "fma"})) == frozenset()
    monkeypatch.setattr(native, "library", lambda: None)  # the library could not be built
    assert decode_kernel_dtypes(frozenset({"avx512f"})) == frozenset()
