"""model_store/lm_reference.py: the language model guard's float answers, made by the build once
per model and shipped in each judged variant's archive."""

from __future__ import annotations

import shutil

import pytest
from transformers import AutoTokenizer

from handlers.backends import Backend
from handlers.generation import agreement
from handlers.generation.settings import GenerationSettings, KvCache
from handlers.settings import Weights
from model_store import lm_reference
from tests.hf_models import qwen2_lm


@pytest.fixture
def staged(tmp_path, monkeypatch):
    """A language model's staged files, the build's answers forgotten, the float model's runs counted."""
    monkeypatch.setattr(lm_reference, "_ANSWERED", {})
    runs = []
    made = agreement.Reference.of
    monkeypatch.setattr(agreement.Reference, "of", lambda *a: runs.append(a) or made(*a))
    return qwen2_lm(tmp_path / "lm"), runs


def shipped(directory, settings):
    said = []
    lm_reference.ship_reference(settings, directory, "lm", said.append)
    return (directory / agreement.REFERENCE_FILE).is_file(), said


@pytest.mark.parametrize(
    "settings",
    [GenerationSettings(weights=Weights.INT8), GenerationSettings(kv_cache=KvCache.INT8)],
    ids=["int8-weights", "int8-kv"],
)
def test_a_judged_variant_ships_the_answers_its_workers_read(staged, settings):
    directory, _ = staged
    written, said = shipped(directory, settings)
    assert written and said[0].startswith("the float model's answers on 8 held-out prompts shipped (")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    prompts = agreement.held_out_prompts(directory, settings, lambda text: list(tokenizer(text)["input_ids"]))
    assert agreement.Reference.shipped(directory, prompts, agreement.judged_tokens(settings)) is not None


@pytest.mark.parametrize(
    "settings",
    [GenerationSettings(), GenerationSettings(backend=Backend.OPENVINO, weights=Weights.INT8)],
    ids=["float32", "openvino"],
)
def test_float32_and_openvino_variants_ship_none(staged, settings):
    """float32 is not judged; an openvino variant is judged by the build itself, on its IR."""
    directory, runs = staged
    assert shipped(directory, settings) == (False, []) and runs == []


def test_the_float_model_answers_once_for_every_variant_of_a_model(staged, tmp_path):
    directory, runs = staged
    other = shutil.copytree(directory, tmp_path / "other-variant")
    assert shipped(directory, GenerationSettings(weights=Weights.INT8))[0]
    assert shipped(other, GenerationSettings(kv_cache=KvCache.INT8))[0]
    assert len(runs) == 1
    assert shipped(other, GenerationSettings(weights=Weights.INT8, accuracy_prompts=3))[0]  # other prompts
    assert len(runs) == 2
