"""handlers/generation/quantized.py: a language model's linear weights stored in int8, one scale per
output channel, the model still computing in its dtype (how close it answers: test_agreement.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from handlers.generation.quantized import int8_weights
from tests.hf_models import qwen2_lm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_linear_weight_is_int8_with_a_scale_per_output_channel(tmp_path, dtype):
    model = AutoModelForCausalLM.from_pretrained(qwen2_lm(tmp_path / "lm"), dtype=torch.float32).eval().to(dtype)
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    shapes = [tuple(m.weight.shape) for m in linears]
    assert int8_weights(model) == len(linears) > 0
    for linear, shape in zip(linears, shapes, strict=True):
        weight = linear.weight
        assert (weight.qdata.dtype, tuple(weight.qdata.shape)) == (torch.int8, shape)
        assert weight.scale.numel() == shape[0]
    # The tied head got its own int8 copy; the embedding's lookup table stays in the model's dtype.
    assert model.get_input_embeddings().weight.dtype == dtype
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.dtype == dtype and torch.isfinite(logits).all()
