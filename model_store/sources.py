"""A model file's source -> the files its archives carry, and the handler settings they imply.

    settings = write_source(staging, Model.load("mine"))   # {"architecture": "hf-sequence-classifier", ...}

One writer per source kind (kit/models.py SourceKind): a recipe of the bundled models, a Hugging
Face directory (model_store/huggingface.py reads it), or a torch.export program. The model file's
own `handler:` settings are laid over what the source implies.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from handlers.loaders import EXPORTED_FILE
from handlers.samples import SAMPLES_DIR
from handlers.settings import Architecture
from handlers.text import TOKENIZER_FILE
from handlers.typed_config import SettingsError
from kit.models import Medium, Model, SourceKind, Task
from kit.samples import Body, read_samples
from model_store import exported, huggingface
from model_store.recipes import RECIPES, bundled_tokenizer

LABELS_FILE = "labels.json"
# Weights of other frameworks a Hugging Face directory may also hold: not needed, often large.
FOREIGN_WEIGHTS = ("*.h5", "*.msgpack", "*.onnx", "*.ot", "*.tflite", ".git")


def log(message: str) -> None:
    print(f"[archive] {message}", flush=True)


def require(path: Path, what: str) -> Path:
    if not path.exists():
        raise SettingsError(f"{what} {path} does not exist; fix `source:` in the model file")
    return path


def write_recipe(staging: Path, model: Model) -> dict[str, Any]:
    recipe = model.source.location
    if recipe not in RECIPES:
        raise SettingsError(f"recipe {recipe!r} is unknown; the kit has: {', '.join(sorted(RECIPES))}")
    RECIPES[recipe](staging, model)
    return {}


def write_exported(staging: Path, model: Model) -> dict[str, Any]:
    path = require(model.source.path, "exported program")
    if model.task is Task.TENSOR:
        declared = {key: model.handler_settings.get(key) for key in ("input_shapes", "input_dtypes")}
        if declared != (takes := exported.tensor_inputs(path)):
            raise SettingsError(
                f"{model.file} declares inputs {declared}, but {path} takes {takes}; "
                f"rewrite the model file: make model NAME={model.name} SRC={path} TASK=tensor FORCE=1"
            )
    shutil.copy(path, staging / EXPORTED_FILE)
    settings = {"architecture": Architecture.EXPORTED_PROGRAM.value}
    if model.task.medium is Medium.TEXT:
        shutil.copy(bundled_tokenizer(), staging / TOKENIZER_FILE)
        log(f"{model.name}: an exported text model gets bert-base-uncased's vocabulary ({TOKENIZER_FILE})")
        return {**settings, **exported.text_inputs(path)}  # exactly the inputs its forward takes
    return settings


# The handler settings that bound a text's tokens (a classifier's input, a language model's context).
LENGTH_KEYS = ("max_length", "context_length")


def write_huggingface(staging: Path, model: Model) -> dict[str, Any]:
    directory = require(model.source.path, "Hugging Face directory")
    derived = huggingface.derive(directory, model.task)
    for key in LENGTH_KEYS:
        asked = model.handler_settings.get(key)
        if derived.longest_text and isinstance(asked, int) and asked > derived.longest_text:
            raise SettingsError(
                f"{model.file} asks for {key} {asked}, but {directory} takes at most {derived.longest_text} tokens "
                "(its tokenizer's model_max_length and config.json max_position_embeddings); lower it"
            )
    shutil.copytree(directory, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*FOREIGN_WEIGHTS))
    if derived.labels:
        (staging / LABELS_FILE).write_text(json.dumps(list(derived.labels)))
        return {**derived.settings, "labels_file": LABELS_FILE}
    return derived.settings


def write_samples(directory: Path, bodies: list[Body], use: str) -> None:
    directory.mkdir()
    for index, body in enumerate(bodies):
        (directory / str(index)).write_bytes(body.data)
    log(f"{len(bodies)} samples of your own: {use}")


WRITERS: dict[SourceKind, Callable[[Path, Model], dict[str, Any]]] = {
    SourceKind.RECIPE: write_recipe,
    SourceKind.EXPORTED: write_exported,
    SourceKind.HUGGINGFACE: write_huggingface,
}


def write_source(staging: Path, model: Model) -> dict[str, Any]:
    """Write the model's files into staging; returns its handler settings (the model file's win)."""
    settings = WRITERS[model.source.kind](staging, model)
    if model.samples:
        write_samples(
            staging / SAMPLES_DIR, read_samples(Path(model.samples), model.task.medium), model.task.samples_use
        )
    if model.labels:  # the model file's own class names replace any the source has
        shutil.copy(require(Path(model.labels), "labels file"), staging / LABELS_FILE)
        settings = {**settings, "labels_file": LABELS_FILE}
    settings = {**settings, **model.handler_settings}
    if "architecture" not in settings:  # a handler default would load some other model's code
        raise SettingsError(
            f"{model.file} names no `architecture:` under `handler:` and its source implies none; "
            f"give one of: {', '.join(a.value for a in Architecture)}"
        )
    return settings
