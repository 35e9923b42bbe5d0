"""handlers/generation/packed_linear.py: a model on packed weights answers as on its plain ones."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from handlers.generation.linears import OpaqueLinear
from handlers.generation.packed_linear import Packed, can_pack, pack_linears
from tests.hf_models import gpt2_lm, qwen2_lm
from tests.machines import bfloat16_param

pytestmark = pytest.mark.skipif(not can_pack(), reason="this torch has no oneDNN")


def bf16_bound(expected: torch.Tensor, exact: torch.Tensor) -> float:
    # Packing reorders no sum on this repository's AMX Xeon (equal bit for bit); elsewhere oneDNN
    # may pick other kernels for the two: no further from plain bf16 than bf16 from fp32.
    return (expected - exact).abs().max()


def fp32_bound(expected: torch.Tensor, exact: torch.Tensor) -> float:
    # Another summation order: float32's rounding, a few units in the 6th digit of the largest logit.
    return 1e-5 * exact.abs().max()


BOUNDS = {torch.bfloat16: bf16_bound, torch.float32: fp32_bound}


@pytest.mark.parametrize("dtype", [bfloat16_param(), torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("family", [qwen2_lm, gpt2_lm], ids=["qwen2", "gpt2"])
def test_a_packed_model_gives_the_plain_models_logits_eager_and_compiled(family, dtype, tmp_path):
    plain = AutoModelForCausalLM.from_pretrained(family(tmp_path)).eval().to(dtype)
    linears = sum(type(m) is nn.Linear for m in plain.modules())
    packed = copy.deepcopy(plain)
    assert pack_linears(packed) == linears > 0  # GPT-2's projections are Conv1D: only its head is a Linear
    assert not any(type(m) is nn.Linear for m in packed.modules())
    assert sum(isinstance(m, OpaqueLinear) and isinstance(m.kernel, Packed) for m in packed.modules()) == linears
    ids = torch.randint(0, plain.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        exact = copy.deepcopy(plain).float()(input_ids=ids).logits
        for run in (lambda m: m(input_ids=ids), lambda m: torch.compile(m.forward, dynamic=True)(input_ids=ids)):
            expected, got = run(plain).logits.float(), run(packed).logits.float()
            assert (got - expected).abs().max() <= BOUNDS[dtype](expected, exact)
            assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_the_plain_weights_are_dropped(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(qwen2_lm(tmp_path), tie_word_embeddings=False)
    before = sum(p.numel() for p in model.parameters())
    head = model.lm_head.weight.numel()
    projections = sum(p.numel() for m in model.modules() if type(m) is nn.Linear for p in m.parameters())
    pack_linears(model)
    assert sum(p.numel() for p in model.parameters()) == before - projections
    assert projections > head
