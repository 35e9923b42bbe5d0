"""Hugging Face directories of architectures the kit does not bundle, random weights, for trying
`make model` without a download and for the bench's "your model" table.

    .venv/bin/python -m bench.example_models distilbert /tmp/distilbert   # DistilBERT-base classifier, 66 M
    .venv/bin/python -m bench.example_models vit /tmp/vit                 # ViT-B/16 classifier, 86 M, 224 px

Written with save_pretrained, as a fine-tuned checkpoint is: config.json (labels in id2label),
model.safetensors, the tokenizer (bert-base-uncased's vocabulary, shipped in a pip package) or
the image processor. Seeded: the same bytes on every machine.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

SEED = 0
SENTIMENT = {0: "negative", 1: "neutral", 2: "positive"}
ANIMALS = {0: "cat", 1: "dog", 2: "bird", 3: "fish", 4: "frog", 5: "horse"}


def distilbert(directory: Path, dim: int = 768, layers: int = 6, heads: int = 12, init: float = 0.02) -> Path:
    """A DistilBERT sequence classifier: its forward takes no token_type_ids."""
    import torch
    from transformers import DistilBertConfig, DistilBertForSequenceClassification, DistilBertTokenizerFast

    from model_store.recipes import bundled_tokenizer

    torch.manual_seed(SEED)
    tokenizer = DistilBertTokenizerFast(tokenizer_file=str(bundled_tokenizer()))
    config = DistilBertConfig(
        vocab_size=tokenizer.vocab_size, dim=dim, hidden_dim=4 * dim, n_layers=layers, n_heads=heads,
        initializer_range=init, id2label=SENTIMENT, label2id={v: k for k, v in SENTIMENT.items()},
    )  # fmt: skip
    DistilBertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def vit(
    directory: Path,
    size: int = 224,
    patch: int = 16,
    dim: int = 768,
    layers: int = 12,
    heads: int = 12,
    init: float = 0.02,
) -> Path:
    """A ViT image classifier with its image processor (resize to size x size, mean/std 0.5)."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(SEED)
    config = ViTConfig(
        image_size=size, patch_size=patch, hidden_size=dim, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * dim, initializer_range=init, id2label=ANIMALS, label2id={v: k for k, v in ANIMALS.items()},
    )  # fmt: skip
    ViTForImageClassification(config).save_pretrained(directory)
    ViTImageProcessor(size={"height": size, "width": size}).save_pretrained(directory)
    return directory


EXAMPLES: dict[str, Callable[[Path], Path]] = {"distilbert": distilbert, "vit": vit}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("example", choices=sorted(EXAMPLES))
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    EXAMPLES[args.example](args.directory)
    print(f"[example] {args.example} written to {args.directory}: make model NAME={args.example} SRC={args.directory}")


if __name__ == "__main__":
    main()
