"""The tiny random language models the engine's tests run on, one family at a time: Llama-style
(Qwen2, grouped KV heads, RoPE) and GPT-2 (learned positions)."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.hf_models import gpt2_lm, qwen2_lm

FAMILIES = {"qwen2": qwen2_lm, "gpt2": gpt2_lm}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def lm(request, tmp_path_factory):
    directory = FAMILIES[request.param](tmp_path_factory.mktemp(request.param))
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    return model, AutoTokenizer.from_pretrained(directory)
