"""handlers/generation/weights.py: after packing, nothing of the model maps its checkpoint's file
(read from /proc/self/maps), the answers stay, and the parts are counted; a conversion to the
served dtype lets the checkpoint's pages go as it goes, and a bf16 checkpoint served in float32
peaks no higher than a float32 one."""

from __future__ import annotations

import gc
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.example_models import qwen2
from handlers.generation.packed_linear import can_pack, pack_linears
from handlers.generation.weights import converted, kernels, own_memory, served_form, weight_parts
from handlers.loaders import causal_lm_as_saved
from kit.paths import ROOT
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


@pytest.mark.skipif(not can_pack(), reason="this torch has no oneDNN")
def test_a_bf16_checkpoint_as_served_in_float32_answers_as_transformers_float32_model_packed(tmp_path):
    directory = qwen2_lm(tmp_path / "f32")
    bf16 = tmp_path / "bf16"
    shutil.copytree(directory, bf16)
    AutoModelForCausalLM.from_pretrained(directory).to(torch.bfloat16).save_pretrained(bf16)
    model = causal_lm_as_saved(bf16)
    assert model.dtype == torch.bfloat16
    twin = AutoModelForCausalLM.from_pretrained(bf16, dtype=torch.float32).eval()
    said = kernels(twin, torch.float32, int8=False)  # the kernels this CPU serves float32 on
    assert said.startswith(f"{sum(type(m) is torch.nn.Linear for m in model.modules())} linear layers on ")
    assert served_form(model, bf16, torch.float32, int8=False) == [said]
    assert not mapped(bf16 / "model.safetensors")  # the embedding's rows are read, not mapped
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, twin(input_ids=ids).logits)


# A fresh process's load of a checkpoint as the handler serves it (float32), printing how far its
# peak rose above what the process held before: the model's classes imported, nothing loaded.
LOAD = """
import re, sys
from pathlib import Path
import torch
from transformers import Qwen2ForCausalLM
from handlers.generation.weights import served_form
from handlers.loaders import causal_lm_as_saved

def kb(field):
    return int(re.search(field + r":\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1))

before = kb("VmRSS")
served_form(causal_lm_as_saved(sys.argv[1]), Path(sys.argv[1]), torch.float32, int8=False)
print(kb("VmHWM") - before)
"""


@pytest.mark.skipif(not can_pack(), reason="this torch has no oneDNN")
def test_a_bf16_checkpoint_served_in_float32_peaks_no_higher_than_a_float32_one(tmp_path):
    """Layers converted one at a time as their kernels are made, the head first and the embedding
    read from the file: no float32 copy of the tied table beside the kernels. On this shape (390
    MB of float32 weights, the table 311 MB of them) the load rose 611 MB from a float32
    checkpoint; from a bf16 one, 714 MB read as float32 by transformers and 711 MB converted whole
    before packing, 619 MB now (glibc's malloc; tcmalloc and jemalloc alike)."""
    float32 = qwen2(tmp_path / "f32", dim=512, layers=4, heads=8, kv_heads=2)
    bf16 = tmp_path / "bf16"
    shutil.copytree(float32, bf16)
    AutoModelForCausalLM.from_pretrained(float32).to(torch.bfloat16).save_pretrained(bf16)
    rise = {}
    for directory in (float32, bf16):
        run = subprocess.run(
            [sys.executable, "-c", LOAD, str(directory)], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stderr
        rise[directory.name] = int(run.stdout.split()[-1]) * 1024
    weights = (float32 / "model.safetensors").stat().st_size
    assert rise["bf16"] <= rise["f32"] + 0.05 * weights, rise
