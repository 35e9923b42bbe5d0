"""Build an eval-mode nn.Module from the files of an extracted model archive.

    model = load_model(Architecture.RESNET50, "/tmp/models/abc123")

The archive says which loader to use (`architecture:` in model-config.yaml); the loader
never guesses from file names.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from handlers.settings import Architecture

WEIGHTS_FILE = "model.pt"  # a state dict
EXPORTED_FILE = "model.pt2"  # a torch.export ExportedProgram
TEXT_CONFIG_FILE = "config.json"  # transformers BertConfig


def _require(model_dir: Path, name: str) -> Path:
    path = model_dir / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the archive; rebuild it with `make archive`")
    return path


def _state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(_require(model_dir, WEIGHTS_FILE), map_location="cpu", weights_only=True)


def _load_resnet50(model_dir: Path) -> nn.Module:
    from handlers.architectures.resnet import resnet50

    model = resnet50()
    model.load_state_dict(_state_dict(model_dir))
    return model


def _bert_config(model_dir: Path):
    from transformers import BertConfig

    return BertConfig(**json.loads(_require(model_dir, TEXT_CONFIG_FILE).read_text()))


def _load_bert(model_dir: Path, class_name: str) -> nn.Module:
    from handlers.architectures import text

    model = getattr(text, class_name)(_bert_config(model_dir))
    model.load_state_dict(_state_dict(model_dir))
    return model


def _load_exported_program(model_dir: Path) -> nn.Module:
    return torch.export.load(_require(model_dir, EXPORTED_FILE)).module()


LOADERS: dict[Architecture, Callable[[Path], nn.Module]] = {
    Architecture.RESNET50: _load_resnet50,
    Architecture.BERT_CLASSIFIER: functools.partial(_load_bert, class_name="BertClassifier"),
    Architecture.SENTENCE_EMBEDDER: functools.partial(_load_bert, class_name="SentenceEmbedder"),
    Architecture.EXPORTED_PROGRAM: _load_exported_program,
}


def load_model(architecture: Architecture, model_dir: str | Path) -> nn.Module:
    model = LOADERS[architecture](Path(model_dir))
    # An ExportedProgram's module() refuses .eval(); it is already in inference form.
    if architecture is not Architecture.EXPORTED_PROGRAM:
        model.eval()
    return model
