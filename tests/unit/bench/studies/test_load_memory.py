"""bench/studies/load_memory.py: each served dtype and weight kind loaded as a worker loads it, in a
process of its own, with its peak, what it keeps and the weights' parts."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.studies import load_memory
from handlers.generation.packed_linear import can_pack
from tests.hf_models import qwen2_lm


@pytest.mark.skipif(not can_pack(), reason="this torch has no oneDNN")
def test_a_bf16_checkpoint_loaded_packed_and_on_int8_weights_in_processes_of_their_own(tmp_path, monkeypatch):
    directory = qwen2_lm(tmp_path / "lm")
    AutoModelForCausalLM.from_pretrained(directory).to(torch.bfloat16).save_pretrained(directory)
    monkeypatch.setattr(load_memory, "RESULTS", tmp_path / "results")
    assert load_memory.main([str(directory), "--dtypes", "float32"]) == 0
    (out,) = (tmp_path / "results").iterdir()
    loads = [load_memory.Load(**r) for r in json.loads((out / "results.json").read_text())["loads"]]
    assert [(r.checkpoint, r.dtype, r.weights) for r in loads] == [
        ("bfloat16", "float32", "packed"),
        ("bfloat16", "float32", "int8"),
    ]
    packed, int8 = loads
    for r in loads:
        assert r.peak_gib >= r.rss_gib > 0 and r.seconds > 0
        assert r.parts_mb["embedding read from the file"] > 0  # the tied table's rows read, not held
    # float32 kernels hold 4 bytes a weight, int8 ones 1 and a scale per row.
    assert 3.5 < packed.parts_mb["linear kernels"] / int8.parts_mb["linear kernels"] < 4.0
    assert "| bfloat16 | float32 | int8 |" in (out / "report.md").read_text()


def test_an_unknown_dtype_or_weight_kind_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_memory.main([str(tmp_path), "--dtypes", "float16", "--weights", "int4"])
    assert "unknown float16, int4: dtypes are float32, bfloat16; weights packed, int8" in capsys.readouterr().err
