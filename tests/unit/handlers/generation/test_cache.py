"""handlers/generation/cache.py: what a position holds, as the plan counts it, equals what the
engine's cache keeps per position; the cache's memory is resident only where written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from handlers.generation.cache import KvShape, SlotCache, row_bytes, untouched_zeros
from handlers.generation.engine import Engine
from handlers.generation.scheduler import Discard, Generation
from tests.hf_models import gpt2_lm, qwen2_lm

MB = 1 << 20


def resident() -> int:
    """This process's resident memory, from /proc (kB -> bytes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.parametrize("family", [qwen2_lm, gpt2_lm], ids=["qwen2", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_rows_bytes_are_what_the_engine_allocates_per_sequence(family, dtype, tmp_path):
    directory = family(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(directory).eval().to(dtype)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    engine = Engine(model, tokenizer.decode, set(), slots=3, context=192, dtype=dtype)
    engine.submit(Generation((1, 2, 3), 2), Discard())
    while engine.busy:
        engine.step()
    # Three rows of the context and the scratch position: what the plan counts, and one position.
    assert engine.cache.bytes == 3 * row_bytes(model.config, 192 + 1, dtype) > 0


def test_the_cache_is_resident_only_where_written():
    before = resident()
    zeros = untouched_zeros((256, 1024, 256), torch.float32)  # 256 MB
    assert float(zeros[100, 5, 7]) == 0.0
    assert resident() - before < 32 * MB
    zeros[:64] = 1.0  # a quarter written
    grown = resident() - before
    assert 60 * MB < grown < 100 * MB


def test_a_layer_whose_keys_differ_from_its_config_is_refused_by_name(tmp_path):
    config = AutoConfig.from_pretrained(qwen2_lm(tmp_path))
    shape = KvShape.of(config)
    cache = SlotCache(shape, slots=2, context=8, dtype=torch.float32)
    cache.select(slice(0, 1), torch.tensor([[4]]), 8)
    wrong = torch.zeros(1, shape.kv_heads + 1, 1, shape.head_size)
    with pytest.raises(ValueError, match=f"layer 0 computes keys of {shape.kv_heads + 1} heads"):
        cache.update(wrong, wrong, 0)
