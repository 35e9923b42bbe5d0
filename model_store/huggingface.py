"""A Hugging Face Transformers directory (as save_pretrained writes it) -> the kit's handler settings.

    derived = derive(Path("/data/my-vit"), Task.IMAGE_CLASSIFICATION)
    derived.settings      # {"architecture": "hf-image-classifier", "resize": 224, "fit": "stretch", ...}
    derived.labels        # ("cat", "dog"): config.json's id2label, in index order

Read from the directory: the architecture (config.json), the labels (`id2label`), the tokenizer,
its inputs, pad token and maximum length, and the image preprocessing (preprocessor_config.json),
which the kit reproduces with its own faster decoder (handlers/image.py). An option the kit
cannot reproduce is refused here, by name, before anything is built. Nothing is fetched.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from handlers.generation.settings import GenerationSettings
from handlers.settings import Architecture, Fit, Pooling, Resample, TextSettings
from handlers.text import ENCODING_FIELDS, TOKENIZER_FILE
from handlers.typed_config import SettingsError
from kit.models import TASKS, Task

CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "preprocessor_config.json"
# PIL's filter numbers, as image processor configs store them.
PIL_RESAMPLE = {0: Resample.NEAREST, 1: Resample.LANCZOS, 2: Resample.BILINEAR, 3: Resample.BICUBIC}
# preprocessor_config.json keys that only name classes, or say what the kit does anyway.
INERT_KEYS = {"image_processor_type", "feature_extractor_type", "processor_class", "do_convert_rgb"}
# A classifier's outputs the kit turns into probabilities with a softmax over its labels.
SOFTMAX_PROBLEMS = {None, "single_label_classification"}


class SourceError(SettingsError):
    """The directory holds something the kit cannot serve as asked; the message says what."""


@dataclasses.dataclass(frozen=True)
class Derived:
    settings: dict[str, Any]  # the handler settings the directory implies
    labels: tuple[str, ...] = ()
    longest_text: int = 0  # tokens: the most the model's own files take (0: not a text model)


def read_json(directory: Path, name: str) -> dict[str, Any]:
    path = directory / name
    if not path.is_file():
        raise SourceError(f"{directory} has no {name}; save the model with save_pretrained() into it")
    return json.loads(path.read_text())


def labels(config: dict[str, Any]) -> tuple[str, ...]:
    if config.get("problem_type") not in SOFTMAX_PROBLEMS:
        raise SourceError(
            f"config.json problem_type {config['problem_type']!r} is not served: the kit answers a "
            "softmax over the labels (single_label_classification)"
        )
    id2label = config.get("id2label") or {}
    if len(id2label) < 2:
        raise SourceError(f"config.json has {len(id2label)} label(s) in id2label; a classifier needs 2 or more")
    return tuple(id2label[str(i)] if str(i) in id2label else id2label[i] for i in range(len(id2label)))


def text_settings(directory: Path, config: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The tokenizer's settings and the longest text, in tokens, the model's files allow."""
    from transformers import AutoTokenizer

    if not (directory / TOKENIZER_FILE).is_file():
        raise SourceError(
            f"{directory} has no {TOKENIZER_FILE}: save a fast tokenizer with it "
            "(AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(dir))"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    for side in ("padding_side", "truncation_side"):
        if getattr(tokenizer, side) != "right":
            raise SourceError(
                f"tokenizer {side} {getattr(tokenizer, side)!r} is not reproduced: the kit pads and cuts on the right"
            )
    names = set(tokenizer.model_input_names)
    if not {"input_ids", "attention_mask"} <= names <= set(ENCODING_FIELDS):
        raise SourceError(
            f"the tokenizer's model_input_names {sorted(names)} are not served: the kit gives input_ids and "
            f"attention_mask, and token_type_ids to a model that takes them"
        )
    if tokenizer.pad_token is None:
        raise SourceError(
            "the tokenizer has no pad_token; set one (e.g. tokenizer.pad_token = tokenizer.eos_token) and save it"
        )
    # The directory's limit, but served at most at the kit's default: every request is padded to it.
    limit = min(tokenizer.model_max_length, config.get("max_position_embeddings") or tokenizer.model_max_length)
    return {
        "max_length": int(min(limit, TextSettings.max_length)),
        "input_names": [name for name in ENCODING_FIELDS if name in names],  # the wrappers' order
        "pad_token": str(tokenizer.pad_token),
    }, int(limit)


def square(size: dict[str, int], key: str) -> int:
    if size.get("height") != size.get("width"):
        raise SourceError(f"{PREPROCESSOR_FILE} {key} {size} is not square; the kit serves square inputs")
    return int(size["height"])


def image_settings(directory: Path) -> dict[str, Any]:
    processor = read_json(directory, PREPROCESSOR_FILE)
    known = INERT_KEYS | {
        "do_resize",
        "size",
        "resample",
        "do_center_crop",
        "crop_size",
        "crop_pct",
        "do_rescale",
        "rescale_factor",
        "do_normalize",
        "image_mean",
        "image_std",
    }
    refused = sorted(k for k, v in processor.items() if k not in known and v not in (None, False))
    if refused:
        raise SourceError(f"{PREPROCESSOR_FILE} options {refused} are not reproduced by the kit's preprocessing")
    if not processor.get("do_resize", True):
        raise SourceError(f"{PREPROCESSOR_FILE} do_resize false: the kit serves one input size, it must resize")
    if processor.get("resample", 2) not in PIL_RESAMPLE:
        raise SourceError(f"{PREPROCESSOR_FILE} resample {processor['resample']} is unknown; PIL's are {PIL_RESAMPLE}")
    size = processor.get("size") or {}
    cropped = bool(processor.get("do_center_crop"))
    crop = square(processor["crop_size"], "crop_size") if cropped else None
    if "shortest_edge" in size:
        edge = int(size["shortest_edge"])
        if crop is None and processor.get("crop_pct") is not None:  # ConvNeXt: resize edge/crop_pct, crop edge
            resize, crop, fit = int(edge / processor["crop_pct"]), edge, Fit.CROP
        elif crop is None:
            raise SourceError(
                f"{PREPROCESSOR_FILE} size {size} without a centre crop keeps the aspect ratio; the kit serves square inputs"
            )
        else:
            resize, fit = edge, Fit.CROP
    elif {"height", "width"} <= set(size):
        resize, fit = square(size, "size"), Fit.STRETCH
        crop = crop or resize
    else:
        raise SourceError(
            f"{PREPROCESSOR_FILE} size {size} is not reproduced: give {{shortest_edge}} or {{height, width}}"
        )
    normalize = processor.get("do_normalize", True)
    return {
        "resize": resize,
        "crop": crop,
        "fit": fit.value,
        "resample": PIL_RESAMPLE[processor.get("resample", 2)].value,
        "rescale": float(processor.get("rescale_factor", 1 / 255)) if processor.get("do_rescale", True) else 1.0,
        "mean": list(processor.get("image_mean", (0.5, 0.5, 0.5))) if normalize else [0.0, 0.0, 0.0],
        "std": list(processor.get("image_std", (0.5, 0.5, 0.5))) if normalize else [1.0, 1.0, 1.0],
        # A transformer's patch embedding gains nothing from NHWC, a CNN does; the kit cannot tell.
        "channels_last": False,
    }


def pooling(directory: Path) -> dict[str, Any]:
    """A sentence-transformers directory says its pooling and normalisation; else mean, unit length."""
    modules = directory / "modules.json"
    if not modules.is_file():
        return {"pooling": Pooling.MEAN.value, "normalize": True}
    kinds = {m["type"].rsplit(".", 1)[-1]: m["path"] for m in json.loads(modules.read_text())}
    config = read_json(directory / kinds.get("Pooling", "1_Pooling"), "config.json")
    modes = sorted(k for k, v in config.items() if k.startswith("pooling_mode_") and v)
    chosen = {"pooling_mode_mean_tokens": Pooling.MEAN, "pooling_mode_cls_token": Pooling.CLS}
    if len(modes) != 1 or modes[0] not in chosen:
        raise SourceError(f"sentence-transformers pooling {modes} is not reproduced; the kit pools by {sorted(chosen)}")
    other = sorted(set(kinds) - {"Transformer", "Pooling", "Normalize"})
    if other:
        raise SourceError(f"sentence-transformers modules {other} are not reproduced (modules.json)")
    return {"pooling": chosen[modes[0]].value, "normalize": "Normalize" in kinds}


def _image_classification(directory: Path, config: dict[str, Any]) -> Derived:
    settings = {"architecture": Architecture.HF_IMAGE_CLASSIFIER.value, **image_settings(directory)}
    return Derived(settings, labels(config))


def _text_classification(directory: Path, config: dict[str, Any]) -> Derived:
    text, longest = text_settings(directory, config)
    return Derived({"architecture": Architecture.HF_SEQUENCE_CLASSIFIER.value, **text}, labels(config), longest)


def _feature_extraction(directory: Path, config: dict[str, Any]) -> Derived:
    text, longest = text_settings(directory, config)
    settings = {"architecture": Architecture.HF_FEATURE_EXTRACTOR.value, **text, **pooling(directory)}
    return Derived(settings, longest_text=longest)


def generation_context(directory: Path) -> int:
    """The most tokens a sequence may hold, prompt and answer: the model's positions, its
    tokenizer's limit and an attention window it slides, whichever is least."""
    from transformers import AutoConfig, AutoTokenizer

    if not (directory / TOKENIZER_FILE).is_file():
        raise SourceError(
            f"{directory} has no {TOKENIZER_FILE}: save a fast tokenizer with it "
            "(AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(dir))"
        )
    config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    limits = [getattr(config, "max_position_embeddings", None), tokenizer.model_max_length]
    # The engine's mask is causal over the whole context: a sliding window ends it.
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        limits.append(config.sliding_window)
    return int(min(limit for limit in limits if isinstance(limit, int) and limit > 0))


def _text_generation(directory: Path, config: dict[str, Any]) -> Derived:
    longest = generation_context(directory)
    # The model's own context, up to the kit's default: the KV cache holds it for every sequence.
    settings = {
        "architecture": Architecture.HF_CAUSAL_LM.value,
        "context_length": min(longest, GenerationSettings.context_length),
    }
    return Derived(settings, longest_text=longest)


DERIVERS: dict[Task, Callable[[Path, dict[str, Any]], Derived]] = {
    Task.IMAGE_CLASSIFICATION: _image_classification,
    Task.TEXT_CLASSIFICATION: _text_classification,
    Task.FEATURE_EXTRACTION: _feature_extraction,
    Task.TEXT_GENERATION: _text_generation,
}


def derive(directory: Path, task: Task) -> Derived:
    return DERIVERS[task](directory, read_json(directory, CONFIG_FILE))


def guess_task(directory: Path) -> Task:
    """The task config.json's architecture (or a sentence-transformers modules.json) implies."""
    if (directory / "modules.json").is_file():
        return Task.FEATURE_EXTRACTION
    architectures = read_json(directory, CONFIG_FILE).get("architectures") or []
    for architecture in architectures:
        for task, traits in TASKS.items():
            if architecture.endswith(traits.architecture_suffixes):
                return task
    raise SourceError(
        f"config.json architectures {architectures} name no task the kit knows; give one: TASK={' | '.join(Task)}"
    )
