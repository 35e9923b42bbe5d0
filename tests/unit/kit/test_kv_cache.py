"""kit/kv_cache.py: a language model's KV cache read from the archive that serves it."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from transformers import AutoConfig

from handlers.backends import DType
from handlers.generation.cache import row_bytes
from kit.kv_cache import archive_sequences, archive_settings
from tests.hf_models import qwen2_lm


def archive_of(tmp_path, handler: dict):
    directory = qwen2_lm(tmp_path / "lm")
    archive = tmp_path / "store" / "lm"  # the files of an archive the plan reads
    archive.mkdir(parents=True)
    (archive / "model-config.yaml").write_text(yaml.safe_dump({"asyncCommunication": True, "handler": handler}))
    shutil.copyfile(directory / "config.json", archive / "config.json")
    return directory, archive


def test_an_archives_settings_are_its_model_configs_handler_settings(tmp_path):
    _, archive = archive_of(tmp_path, {"architecture": "hf-causal-lm", "context_length": 384, "max_sequences": 3})
    settings = archive_settings(archive)
    assert (settings.context_length, settings.max_sequences, settings.dtype) == (384, 3, DType.FLOAT32)


def test_an_archives_sequences_come_from_its_config_and_settings(tmp_path):
    handler = {"architecture": "hf-causal-lm", "context_length": 512, "max_sequences": 6, "dtype": "bfloat16"}
    directory, archive = archive_of(tmp_path, handler)
    sequences = archive_sequences(archive)
    assert sequences.most == 6
    expected = row_bytes(AutoConfig.from_pretrained(directory), 512, torch.bfloat16)
    config = json.loads((directory / "config.json").read_text())
    # layers x (keys, values) x kv heads x head size x positions x 2 bytes
    head = config["hidden_size"] // config["num_attention_heads"]
    assert (
        sequences.per_sequence
        == expected
        == config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head * 512 * 2
    )


@pytest.mark.parametrize(
    ("backend", "side"),
    [("inductor", 4), ("openvino", 8)],  # the kit's float32 scale; OpenVINO's u8: a scale and a zero point
)
def test_an_int8_kv_cache_is_counted_a_byte_an_element_and_what_its_engine_keeps_a_head(tmp_path, backend, side):
    handler = {"architecture": "hf-causal-lm", "backend": backend, "context_length": 512, "kv_cache": "int8"}
    directory, archive = archive_of(tmp_path, handler)
    config = json.loads((directory / "config.json").read_text())
    head = config["hidden_size"] // config["num_attention_heads"]
    assert (
        archive_sequences(archive).per_sequence
        == config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * (head + side) * 512
    )
