"""A tiny language model read whole from its safetensors checkpoint, and how much of that file is
resident: what the tests of letting a checkpoint's pages go share (test_file_pages.py,
test_weights.py, test_quantized.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from tests.hf_models import qwen2_lm


def resident_kb(path: Path) -> int:
    """The Rss of every mapping of the file, from /proc/self/smaps."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:
            inside = len(fields) >= 6 and fields[5] == str(path.resolve())
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def read_whole(directory: Path) -> tuple[nn.Module, Path, int]:
    """A tied Qwen2-style model from its checkpoint after a forward (every weight read: the file's
    pages resident), the checkpoint, and its resident kB then."""
    directory = qwen2_lm(directory)
    checkpoint = directory / "model.safetensors"
    model = AutoModelForCausalLM.from_pretrained(directory, tie_word_embeddings=True).eval()
    with torch.inference_mode():
        model(input_ids=torch.tensor([[3, 14, 15, 92, 65]]))
    before = resident_kb(checkpoint)
    assert before * 1024 >= 0.9 * checkpoint.stat().st_size
    return model, checkpoint, before
