"""handlers/generation/weights.py: after packing, nothing of the model maps its checkpoint's file
(read from /proc/self/maps), the answers stay, and the parts are counted; a conversion to the
served dtype lets the checkpoint's pages go as it goes."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from handlers.generation.packed_linear import can_pack, pack_linears
from handlers.generation.weights import converted, own_memory, weight_parts
from tests.hf_models import qwen2_lm
from tests.unit.handlers.generation.checkpoints import read_whole, resident_kb


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


def test_converting_lets_the_checkpoints_pages_go_and_answers_as_to_does(tmp_path):
    """A float32 checkpoint served in bf16: each weight's pages are let go once its bf16 copy
    exists (converted whole, the file's pages and every copy were resident at once), and the
    model is the one `model.to` gives, tied weights still one tensor."""
    model, checkpoint, before = read_whole(tmp_path)
    twin = AutoModelForCausalLM.from_pretrained(tmp_path, tie_word_embeddings=True).eval().to(torch.bfloat16)
    # The mapping lives while any view of it does: with this one held, what is resident after the
    # conversion is what was during it (`model.to` leaves every page: 10,320 of 10,320 kB here).
    view = model.model.norm.weight.detach()
    assert converted(model, torch.bfloat16) is model
    assert resident_kb(checkpoint) < before / 10
    del view
    assert {t.dtype for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()} == {torch.bfloat16}
    assert model.lm_head.weight is model.get_input_embeddings().weight
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=ids).logits, twin(input_ids=ids).logits, rtol=0, atol=0)
