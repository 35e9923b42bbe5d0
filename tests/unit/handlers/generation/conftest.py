"""The tiny random language models the engine's tests run on, one family at a time: Llama-style
(Qwen2, grouped KV heads, RoPE), GPT-2 (learned positions), Qwen3 (norms on queries and keys,
wide heads) and Llama 3 (RoPE scaled by band)."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.hf_models import gpt2_lm, llama_lm, qwen2_lm, qwen3_lm

FAMILIES = {"qwen2": qwen2_lm, "gpt2": gpt2_lm, "qwen3": qwen3_lm, "llama": llama_lm}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def lm(request, tmp_path_factory):
    directory = FAMILIES[request.param](tmp_path_factory.mktemp(request.param))
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    return model, AutoTokenizer.from_pretrained(directory)
