"""handlers/generation/cache.py: what one sequence's row holds, as the plan counts it, equals what
the engine allocates for it, on tiny random models of two families."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from handlers.generation.cache import row_bytes
from handlers.generation.engine import Discard, Engine, Generation
from tests.hf_models import gpt2_lm, qwen2_lm


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
    assert engine.cache.bytes == 3 * row_bytes(model.config, 192, dtype) > 0
