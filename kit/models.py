"""The model registry: one declarative file per model, config/models/<name>.yaml, found like variants.

    model = Model.load("mine")
    model.task.handler            # "text_classification.py": the handler that serves it
    model.task.medium             # Medium.TEXT: what a request body carries (bench payloads, soak)
    model.source                  # Source(SourceKind.HUGGINGFACE, "/data/my-roberta")
    model.serving                 # the TorchServe model-config.yaml its archives carry
    model_names()                 # every model file, sorted

A model file:

    source: {huggingface: /data/my-roberta}   # or {exported: m.pt2} or {recipe: resnet50}
    task: text-classification                 # or image-classification | feature-extraction | tensor
    handler: {max_length: 128}                # handler settings (handlers/settings.py), optional
    samples: /data/my-queries.txt             # request bodies like your traffic (kit/samples.py), optional
    targets: {speedup: 2.0}                   # what `make bench` checks (Targets), optional
    responseTimeout: 120                      # any other key: TorchServe's model-config.yaml

`make model NAME=... SRC=...` writes one (model_store/model_file.py); the bundled models are
ordinary entries whose `recipe` makes their seeded weights (model_store/recipes.py).
Torch-free: the bench, the planner and the server read it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from pathlib import Path
from typing import Any

import yaml

from handlers.generation.settings import GenerationSettings
from handlers.settings import ImageSettings, OptimizationSettings, TensorSettings, TextSettings
from handlers.typed_config import SettingsError, parse_settings
from kit.layout import Grouping, OmpWaitPolicy
from kit.paths import CONFIG, ROOT

MODELS_DIR = CONFIG / "models"
# TorchServe waits this long for a worker's initialize() (load + compile + warm-up); the kit's
# own start-up deadline (kit/server.py) is the same figure, so neither gives up first.
STARTUP_TIMEOUT_S = 900
SERVING_DEFAULTS = {"responseTimeout": 120, "startupTimeout": STARTUP_TIMEOUT_S}


class Medium(enum.StrEnum):
    """What a request body carries."""

    IMAGE = "image"  # JPEG/PNG bytes
    TEXT = "text"  # UTF-8 text or JSON {"text": ...}
    TENSOR = "tensor"  # JSON numbers: an array, or {"inputs": [array, ...]} (handlers/tensor.py)


@dataclasses.dataclass(frozen=True)
class TaskTraits:
    handler: str  # file under handlers/
    medium: Medium
    settings: type[OptimizationSettings]  # its handler's settings_class: what `handler:` may say
    # How a Hugging Face config.json's `architectures` names a model of the task (`make model`
    # without TASK=): "BertForSequenceClassification" ends with "ForSequenceClassification".
    architecture_suffixes: tuple[str, ...] = ()
    # Its worker batches its own requests (a generation engine): planned one per L3 domain with
    # the domain's cores as threads, whatever the objective (kit/plan.py), unless its settings
    # need a single worker (models.grouping).
    per_domain: bool = False
    # Its workers' OpenMP wait policy over the preset's (None: the preset's).
    omp_wait_policy: OmpWaitPolicy | None = None
    # What `make model ... SAMPLES=` does with your samples, as the build says it.
    samples_use: str = "int8 calibrates on them, the accuracy guard checks on some held out"


class Task(enum.StrEnum):
    IMAGE_CLASSIFICATION = "image-classification"
    TEXT_CLASSIFICATION = "text-classification"
    FEATURE_EXTRACTION = "feature-extraction"
    TENSOR = "tensor"  # anything else an exported program computes: numbers in, numbers out
    TEXT_GENERATION = "text-generation"  # a causal language model: a prompt in, its continuation out

    @property
    def handler(self) -> str:
        return TASKS[self].handler

    @property
    def medium(self) -> Medium:
        return TASKS[self].medium

    @property
    def settings(self) -> type[OptimizationSettings]:
        return TASKS[self].settings

    @property
    def samples_use(self) -> str:
        return TASKS[self].samples_use


TASKS = {
    Task.IMAGE_CLASSIFICATION: TaskTraits(
        "image_classification.py", Medium.IMAGE, ImageSettings, ("ForImageClassification",)
    ),
    Task.TEXT_CLASSIFICATION: TaskTraits(
        "text_classification.py", Medium.TEXT, TextSettings, ("ForSequenceClassification",)
    ),
    Task.FEATURE_EXTRACTION: TaskTraits("sentence_embedding.py", Medium.TEXT, TextSettings),
    Task.TENSOR: TaskTraits("tensor.py", Medium.TENSOR, TensorSettings),
    # The handler answers each request from its own thread, token by token, while more arrive
    # (handlers/text_generation.py); the TorchServe keys that hand it requests come from its
    # settings (`batching`). GPT-2's class is GPT2LMHeadModel, the older name of the same head.
    # Its threads spin a while between OpenMP regions (libgomp's default) rather than sleep at
    # once as the presets' passive policy has them: a decode step is hundreds of regions (a linear
    # layer each, a few tens of microseconds for one sequence), and each would wait for its
    # threads to wake (docs/generation.md, "Workers").
    Task.TEXT_GENERATION: TaskTraits(
        "text_generation.py",
        Medium.TEXT,
        GenerationSettings,
        ("ForCausalLM", "LMHeadModel"),
        per_domain=True,
        omp_wait_policy=OmpWaitPolicy.DEFAULT,
        samples_use="the accuracy guard continues them as prompts (int8 weights calibrate on nothing)",
    ),
}


class SourceKind(enum.StrEnum):
    RECIPE = "recipe"  # model_store/recipes.py makes the files (the bundled models)
    HUGGINGFACE = "huggingface"  # a directory as transformers' save_pretrained writes it
    EXPORTED = "exported"  # a torch.export.save()d ExportedProgram (.pt2)


@dataclasses.dataclass(frozen=True)
class Source:
    kind: SourceKind
    location: str  # the recipe's name, or a path (relative paths: from the repository root)

    @property
    def path(self) -> Path:
        return ROOT / self.location

    @classmethod
    def parse(cls, raw: Any) -> Source:
        if not (isinstance(raw, dict) and len(raw) == 1):
            raise SettingsError(
                f"source must be one of {[k.value for k in SourceKind]} with its value, "
                f"e.g. {{huggingface: /data/my-model}}; got {raw!r}"
            )
        ((kind, location),) = raw.items()
        try:
            return cls(SourceKind(kind), str(location))
        except ValueError:
            raise SettingsError(f"source {kind!r} is unknown; choose one of: {', '.join(SourceKind)}") from None


@dataclasses.dataclass(frozen=True)
class Targets:
    """What `make bench` checks for the model on every run (bench/report.py); null: no check."""

    speedup: float | None = None  # the best served row's req/s over the plan's baseline row
    int8_top1_agreement: float | None = None  # int8 against float32 eager, held-out samples
    int8_cosine_mean: float | None = None


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The kit's own keys of a model file; every other key is TorchServe's."""

    source: dict
    task: Task
    # Paths of files the archive carries beside the weights (e.g. a recipe's trained state dict).
    weights: str = ""
    labels: str = ""  # JSON class names: ["tench", ...] or {"0": "tench"}
    # Request bodies like your traffic (kit/samples.py): int8 calibrates on them, the accuracy
    # guard checks on the held-out ones, the bench sends them. None: the kit's synthetic ones.
    samples: str = ""
    targets: dict = dataclasses.field(default_factory=dict)  # Targets


KIT_KEYS = {f.name for f in dataclasses.fields(ModelSpec)}


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    task: Task
    source: Source
    serving: dict[str, Any] = dataclasses.field(compare=False)  # TorchServe's model-config.yaml
    # Its `handler:` section, parsed: a wrong key or value is an error wherever the file is read.
    # (What the archive serves also has what the source implies: model_store/sources.py.)
    settings: OptimizationSettings = dataclasses.field(compare=False, default_factory=OptimizationSettings)
    weights: str = ""  # absolute paths (a model file's relative ones are from the repository root)
    labels: str = ""
    samples: str = ""
    targets: Targets = Targets()

    @classmethod
    def load(cls, name: str) -> Model:
        return _load(name)

    @property
    def file(self) -> Path:
        return model_file(self.name)

    @property
    def handler_settings(self) -> dict[str, Any]:
        """The `handler:` keys the file gives, as written: they win over what the source implies."""
        return dict(self.serving.get("handler") or {})

    @property
    def inputs(self) -> list[Path]:
        """Files outside the repository the archive is made from (their changes rebuild it)."""
        paths = [Path(p) for p in (self.weights, self.labels, self.samples) if p]
        return paths if self.source.kind is SourceKind.RECIPE else [self.source.path, *paths]


def model_file(name: str) -> Path:
    return MODELS_DIR / f"{name}.yaml"


def grouping(name: str) -> Grouping:
    """How model `name`'s cores are made into workers: one per L3 domain for a task whose worker
    batches its own requests (its trait), or one in all when its settings need a single worker; a
    name without a model file here (`kit plan --models` for another machine) as the objective says."""
    if not model_file(name).is_file():
        return Grouping.OBJECTIVE
    model = Model.load(name)
    if model.settings.single_worker:
        return Grouping.ONE
    return Grouping.DOMAIN if TASKS[model.task].per_domain else Grouping.OBJECTIVE


def omp_wait_policy(name: str) -> OmpWaitPolicy | None:
    """Model `name`'s workers' own OpenMP wait policy (its task's), None for the preset's."""
    return TASKS[Model.load(name).task].omp_wait_policy if model_file(name).is_file() else None


def model_names() -> list[str]:
    return sorted(path.stem for path in MODELS_DIR.glob("*.yaml"))


def parse_model(name: str, raw: dict[str, Any]) -> Model:
    spec = parse_settings(ModelSpec, {k: v for k, v in raw.items() if k in KIT_KEYS})
    try:
        settings = parse_settings(spec.task.settings, raw.get("handler"))
    except SettingsError as error:
        raise SettingsError(f"handler: {error}") from None
    # The keys the settings need win over the file's own (a model file may not say otherwise).
    serving = {**SERVING_DEFAULTS, **{k: v for k, v in raw.items() if k not in KIT_KEYS}, **settings.torchserve_keys()}
    weights, labels, samples = (str(ROOT / p) if p else "" for p in (spec.weights, spec.labels, spec.samples))
    targets = parse_settings(Targets, spec.targets)
    source = Source.parse(spec.source)
    return Model(name, spec.task, source, serving, settings, weights, labels, samples, targets)


@functools.cache
def _load(name: str) -> Model:
    path = model_file(name)
    if not path.is_file():
        raise SettingsError(
            f"model {name!r} is unknown; choose one of: {', '.join(model_names())} "
            f"(or add yours: make model NAME={name} SRC=<Hugging Face directory or .pt2>)"
        )
    try:
        return parse_model(name, yaml.safe_load(path.read_text()) or {})
    except SettingsError as error:
        raise SettingsError(f"{path}: {error}") from None


def check_models(names: list[str] | tuple[str, ...]) -> None:
    """Every name has a model file, or a SettingsError naming those that do not."""
    for name in names:
        Model.load(name)
