"""Shared fixtures: tiny models and real image/text payloads, written to tmp_path."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
# The kit's bundled model files (config/models/): tests name them; the kit's code does not.
BUNDLED_MODELS = ("bert", "minilm", "resnet50")
sys.path.insert(0, str(ROOT))


class TinyCNN(nn.Module):
    """Conv-BN-ReLU-pool-linear: the op mix of a ResNet at a size that compiles in seconds."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.relu(self.bn(self.conv(x)))), 1))


@pytest.fixture
def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    model = TinyCNN().eval()
    # Non-trivial BN statistics, so folding them into the conv is really exercised.
    model.bn.running_mean.uniform_(-0.5, 0.5)
    model.bn.running_var.uniform_(0.5, 2.0)
    return model


@pytest.fixture
def tiny_bert_config():
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=3,
    )


def encode_image(mode: str, size: tuple[int, int], fmt: str = "JPEG", color=None) -> bytes:
    rng = np.random.default_rng(0)
    if color is not None:
        image = Image.new(mode, size, color)
    else:
        channels = {"L": 1, "RGB": 3, "RGBA": 4, "CMYK": 4}[mode]
        pixels = (rng.random((size[1], size[0], channels)) * 255).astype("uint8")
        image = Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.fixture
def jpeg_bytes() -> bytes:
    return encode_image("RGB", (640, 480))
