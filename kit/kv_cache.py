"""A language model's KV cache as the plan counts it, read from the archive that serves it.

    archive_sequences(Path("model_store/inductor-bf16/lm"))   # Sequences(per_sequence=25165824, most=8)

The archive holds what its workers allocate: the model's config.json (layers, kv heads, head size)
and the handler settings of model-config.yaml (context_length, max_sequences, dtype), the model
file's and the variant's merged at build time.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from handlers.archive_files import MODEL_CONFIG, is_archive
from handlers.backends import BACKENDS, OPENVINO_ENGINE, TORCH_ENGINE
from handlers.generation.settings import GenerationSettings, KvCache
from handlers.typed_config import parse_settings
from kit.layout import Sequences
from kit.models import Model, Task, model_file

HF_CONFIG = "config.json"


def served_sequences(name: str, archive: Path) -> Sequences | None:
    """The KV cache of model `name`'s archive when it is a language model's; None otherwise (or
    when there is no such model file or archive: nothing to count)."""
    if not (model_file(name).is_file() and is_archive(archive)) or Model.load(name).task is not Task.TEXT_GENERATION:
        return None
    return archive_sequences(archive)


def archive_settings(archive: Path) -> GenerationSettings:
    """The handler settings its workers serve with (context_length, max_sequences, dtype, ...)."""
    return parse_settings(GenerationSettings, yaml.safe_load((archive / MODEL_CONFIG).read_text()).get("handler"))


def archive_sequences(archive: Path) -> Sequences:
    from transformers import AutoConfig

    from handlers.generation.cache import SCALE_DTYPE, TORCH_DTYPES, row_bytes
    from handlers.generation.openvino_engine import KV_INT8_SIDE

    # What an int8 cache keeps beside each head's vector, by the engine that holds it.
    int8_sides = {TORCH_ENGINE: SCALE_DTYPE.itemsize, OPENVINO_ENGINE: KV_INT8_SIDE}
    settings = archive_settings(archive)
    config = AutoConfig.for_model(**json.loads((archive / HF_CONFIG).read_text()))
    int8 = settings.kv_cache is KvCache.INT8
    side = int8_sides[BACKENDS[settings.backend].generation_engine]
    return Sequences(
        row_bytes(config, settings.context_length, TORCH_DTYPES[settings.dtype], int8, side), settings.max_sequences
    )
