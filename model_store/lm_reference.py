"""The language model accuracy guard's float answers, made by `make archive`: the float32 model
continues the held-out prompts (handlers/generation/agreement.py) here, once, and a variant its
workers judge (eager, inductor: bf16, int8 weights, an int8 KV cache) ships them in its archive.
Its workers then convert their weights without running the float model: they never read every
float32 weight to answer the prompts, which was the highest point of an int8 worker's memory and
a part of its start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from handlers.backends import BACKENDS, TORCH_ENGINE
from handlers.generation import agreement
from handlers.generation.settings import GenerationSettings
from handlers.loaders import load_model

# What the float model answered, by model and prompts: a build makes several variants of a model
# (eager, inductor, openvino), each judged against the same float32 model, which answers once.
_ANSWERED: dict[tuple[str, tuple[tuple[int, ...], ...], int], agreement.Reference] = {}


def float_reference(staging: Path, settings: GenerationSettings, model: str) -> agreement.Reference:
    """The float model's answers on the held-out prompts of the archive's files, as its worker
    would make them (the archive's tokenizer, samples and settings); `model` names it within
    this build."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(staging), local_files_only=True)
    prompts = agreement.held_out_prompts(staging, settings, lambda text: list(tokenizer(text)["input_ids"]))
    tokens = agreement.judged_tokens(settings)
    key = (model, tuple(map(tuple, prompts)), tokens)
    if key not in _ANSWERED:
        _ANSWERED[key] = agreement.Reference.of(load_model(settings, staging), prompts, tokens)
    return _ANSWERED[key]


def ship_reference(settings: GenerationSettings, staging: Path, model: str, say: Callable[[str], None]) -> None:
    """Into the staged archive, when its workers judge the model (the kit's engine at a reduced
    precision); an openvino variant is judged by the build itself (model_store/build.py)."""
    if BACKENDS[settings.backend].generation_engine != TORCH_ENGINE or agreement.limits(settings) is None:
        return
    start = time.perf_counter()
    reference = float_reference(staging, settings, model)
    path = reference.save(staging)
    say(
        f"the float model's answers on {len(reference.prompts)} held-out prompts shipped "
        f"({path.stat().st_size / 1e6:.1f} MB, in {time.perf_counter() - start:.0f}s): "
        f"its workers judge {settings.precision} on them"
    )
