"""handlers/generation/weights.py: after packing, nothing of the model maps its checkpoint's file
(read from /proc/self/maps), the answers stay, and the parts are counted."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from handlers.generation.packed_linear import can_pack, pack_linears
from handlers.generation.weights import own_memory, weight_parts
from tests.hf_models import qwen2_lm


def mapped(path: Path) -> bool:
    return str(path.resolve()) in Path("/proc/self/maps").read_text()


@pytest.mark.skipif(not can_pack(), reason="this torch has no oneDNN")
def test_the_checkpoint_is_no_longer_mapped_and_the_model_answers_as_before(tmp_path):
    directory = qwen2_lm(tmp_path)
    checkpoint = directory / "model.safetensors"
    model = AutoModelForCausalLM.from_pretrained(directory, tie_word_embeddings=True).eval()
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.inference_mode():
        before = model(input_ids=ids).logits
    pack_linears(model)
    gc.collect()
    assert mapped(checkpoint)  # what transformers handed the model are views of the file
    own_memory(model)
    gc.collect()
    assert not mapped(checkpoint)
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=0, atol=1e-4)
    parts = weight_parts(model)
    embedding = model.get_input_embeddings().weight
    assert parts["other"] >= embedding.numel() * 4 > 0
    assert parts["linear kernels"] >= embedding.numel() * 4  # the head packed, and the projections
