"""Tiny Hugging Face Transformers models of architectures the kit does not bundle (bench/example_models.py
at test size), random weights, saved with save_pretrained as a user's directory is.

    text_dir = distilbert_classifier(tmp_path / "distil")   # forward takes no token_type_ids
    image_dir = vit_classifier(tmp_path / "vit")              # with its ViTImageProcessor
"""

from __future__ import annotations

from pathlib import Path

from bench.example_models import ANIMALS, SENTIMENT, distilbert, gpt2, llama, qwen2, qwen3, vit

LABELS, IMAGE_LABELS = SENTIMENT, ANIMALS
# Weights this large give peaked outputs: a comparison of probabilities means something only
# when they differ (the default 0.02 leaves every class near 1/n).
INIT = 0.3


def distilbert_classifier(directory: Path) -> Path:
    return distilbert(directory, dim=64, layers=2, heads=4, init=INIT)


def vit_classifier(directory: Path) -> Path:
    return vit(directory, size=64, patch=16, dim=64, layers=2, heads=4, init=INIT)


# The language models' heads are 64 wide, as real ones are (Qwen2.5-0.5B, Llama 3.2 1B): a compiler
# specialises a length equal to the head size, which the serving tests must meet.
def qwen2_lm(directory: Path) -> Path:
    """Llama-style, grouped KV heads (4 query heads share 2), a chat template."""
    return qwen2(directory, dim=256, layers=2, heads=4, kv_heads=2, init=INIT, vocabulary=0)


def gpt2_lm(directory: Path) -> Path:
    """GPT-2: learned positions, no chat template."""
    return gpt2(directory, dim=128, layers=2, heads=2, init=INIT, vocabulary=0)


def qwen3_lm(directory: Path) -> Path:
    """Qwen3: norms on each head's queries and keys, heads of 128 wider than dim / heads."""
    return qwen3(
        directory, dim=256, layers=2, heads=4, kv_heads=2, head_dim=128, intermediate=512, init=INIT, vocabulary=0
    )


def llama_lm(directory: Path) -> Path:
    """Llama 3: RoPE's frequencies scaled by band (llama3), grouped KV heads."""
    return llama(directory, dim=256, layers=2, heads=4, kv_heads=2, intermediate=512, init=INIT, vocabulary=0)
