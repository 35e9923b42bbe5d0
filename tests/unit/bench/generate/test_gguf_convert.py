"""bench/generate/gguf_convert.py names GPT-2's byte-level split, and only it, for a tokenizer no hash lists."""

from __future__ import annotations

import json

from bench.example_models import causal_tokenizer
from bench.generate.gguf_convert import gpt2_split


def test_the_example_models_tokenizer_splits_as_gpt2(tmp_path):
    causal_tokenizer(size=600).save_pretrained(tmp_path)
    assert gpt2_split(tmp_path)


def test_another_split_or_no_tokenizer_json_is_left_to_the_converter(tmp_path):
    assert not gpt2_split(tmp_path)
    qwen_like = {"type": "Sequence", "pretokenizers": [{"type": "Split"}, {"type": "ByteLevel", "use_regex": False}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps({"pre_tokenizer": qwen_like}))
    assert not gpt2_split(tmp_path)
