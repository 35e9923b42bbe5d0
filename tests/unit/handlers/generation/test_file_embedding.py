"""handlers/generation/file_embedding.py: the input embedding read from the checkpoint's file
answers as the loaded table did, in the file's dtype or another, from one file or shards, eager
and compiled, with nothing of the file mapped (/proc/self/maps); a file whose tensor is not the
model's, or a head that reads the same table, keeps the loaded table."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from handlers.generation.file_embedding import FileEmbedding, read_embedding_from_file
from handlers.generation.packed_linear import can_pack, pack_linears
from handlers.generation.weights import own_memory, weight_parts
from tests.hf_models import gpt2_lm, qwen2_lm
from tests.machines import bfloat16_param

# Packed, the tied head no longer reads the table: only then is it the embedding's alone.
pytestmark = pytest.mark.skipif(not can_pack(), reason="this torch has no oneDNN")

IDS = torch.tensor([[3, 14, 15, 92, 65, 35], [2, 7, 1, 8, 28, 18]])


def logits(model) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=IDS).logits


def load(directory: Path, dtype: torch.dtype = torch.float32):
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).to(dtype).eval()


def mapped(path: Path) -> bool:
    return str(path.resolve()) in Path("/proc/self/maps").read_text()


@pytest.mark.parametrize("dtype", [torch.float32, bfloat16_param()])
def test_the_table_read_from_the_file_answers_as_the_loaded_one(tmp_path, dtype):
    directory = qwen2_lm(tmp_path / "lm")
    model = load(directory, dtype)
    pack_linears(model)  # the tied head apart: the table is the embedding's alone
    assert read_embedding_from_file(model, directory) is None
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, FileEmbedding)
    assert (embedding.table.stored.name, embedding.table.stored.dtype) == ("model.embed_tokens.weight", torch.float32)
    own_memory(model)
    gc.collect()
    assert not mapped(directory / "model.safetensors")
    # Exactly the packed model's on its loaded table (bf16: the table converted whole).
    assert torch.equal(logits(model), logits_packed(directory, dtype))
    parts = weight_parts(model)
    assert parts["embedding read from the file"] == embedding.num_embeddings * embedding.embedding_dim * 4
    assert parts["other"] < parts["embedding read from the file"] / 10  # norms only


def logits_packed(directory: Path, dtype: torch.dtype) -> torch.Tensor:
    """The same model packed, its table loaded: what the file's rows must reproduce exactly."""
    model = load(directory, dtype)
    pack_linears(model)
    return logits(model)


def test_a_bfloat16_checkpoint_in_shards_served_in_float32(tmp_path):
    directory = tmp_path / "bf16"
    load(qwen2_lm(tmp_path / "lm")).to(torch.bfloat16).save_pretrained(directory, max_shard_size="100KB")
    assert len(set(json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    model = load(directory)
    pack_linears(model)
    assert read_embedding_from_file(model, directory) is None
    table = model.get_input_embeddings().table
    assert table.stored.dtype == torch.bfloat16 and table.stored.file.name.startswith("model-")
    assert torch.equal(logits(model), logits_packed(directory, torch.float32))  # transformers' float32 table


def test_compiled_with_dynamic_shapes_the_rows_are_read_at_each_call(tmp_path):
    directory = gpt2_lm(tmp_path / "lm")
    model = load(directory)
    pack_linears(model)
    assert read_embedding_from_file(model, directory) is None
    embedding = torch.compile(model.get_input_embeddings(), dynamic=True, fullgraph=True)
    plain = load(directory).get_input_embeddings()
    for ids in (IDS, IDS[:, :3], torch.tensor([[0], [5], [9]])):
        assert torch.equal(embedding(ids), plain(ids))


def test_a_file_whose_tensor_is_not_the_models_keeps_the_loaded_table(tmp_path):
    directory = gpt2_lm(tmp_path / "lm")
    model = load(directory)
    pack_linears(model)
    table = model.get_input_embeddings().weight
    with torch.no_grad():
        table[7] += 1.0  # no longer what the file holds
    assert read_embedding_from_file(model, directory) == "no tensor of the checkpoint equals the loaded table"
    assert model.get_input_embeddings().weight is table


def test_a_head_that_reads_the_same_table_keeps_it_in_memory(tmp_path):
    directory = qwen2_lm(tmp_path / "lm")
    model = load(directory)  # not packed: the tied head multiplies by the table itself
    embedding = model.get_input_embeddings()
    assert read_embedding_from_file(model, directory) == "the head reads the same table (it is not packed apart)"
    assert model.get_input_embeddings() is embedding


def test_no_safetensors_checkpoint_keeps_the_loaded_table(tmp_path):
    directory = gpt2_lm(tmp_path / "lm")
    model = load(directory)
    (directory / "model.safetensors").unlink()
    assert read_embedding_from_file(model, directory) == "no safetensors tensor of its shape in the checkpoint"
