"""Typed handler settings, parsed once from the `handler:` section of model-config.yaml.

    settings = parse_settings(ImageSettings, context.model_yaml_config.get("handler", {}))

Every settings class is a frozen dataclass; defaults live here and nowhere else. Unknown keys,
unknown choices and wrong types are errors that name the value and the valid choices.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import typing

from handlers.backends import BACKENDS, Backend, BackendTraits, DType, backends_serving, serving_buckets
from handlers.generation.tools import Syntax
from handlers.typed_config import SettingsError, parse_settings


class Architecture(enum.StrEnum):
    """Which loader builds the model from the archive's files (see handlers/loaders.py)."""

    RESNET50 = "resnet50"
    BERT_CLASSIFIER = "bert-classifier"
    SENTENCE_EMBEDDER = "sentence-embedder"
    EXPORTED_PROGRAM = "exported-program"
    # A Hugging Face Transformers directory, through its Auto class (handlers/architectures/auto.py).
    HF_SEQUENCE_CLASSIFIER = "hf-sequence-classifier"
    HF_IMAGE_CLASSIFIER = "hf-image-classifier"
    HF_FEATURE_EXTRACTOR = "hf-feature-extractor"
    HF_CAUSAL_LM = "hf-causal-lm"  # a generative language model (handlers/text_generation.py)


class Pooling(enum.StrEnum):
    """How a feature extractor turns token states [B, S, H] into one vector [B, H]."""

    MEAN = "mean"  # over the real tokens (sentence-transformers' usual recipe)
    CLS = "cls"  # the first token's state


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Fit(enum.StrEnum):
    """How the image reaches crop x crop."""

    CROP = "crop"  # shorter side to `resize`, then the centre crop x crop (torchvision, ConvNeXt)
    # Both sides to `resize` (aspect ratio not kept), then the centre crop x crop when smaller:
    # Hugging Face's {height, width} resizing (ViT: resize = crop, DeiT: 256 then 224).
    STRETCH = "stretch"


class Resample(enum.StrEnum):
    """PIL's resampling filters (handlers/image.py maps them to PIL's)."""

    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    LANCZOS = "lanczos"


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """Image bytes -> model input (handlers/image.py); torchvision's ImageNet recipe by default."""

    resize: int = 256
    crop: int = 224
    fit: Fit = Fit.CROP
    resample: Resample = Resample.BILINEAR
    rescale: float = 1 / 255  # 8-bit pixel -> this scale, before mean and std
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD


class CompileMode(enum.StrEnum):
    DEFAULT = "default"
    MAX_AUTOTUNE = "max-autotune"


class LinearKernel(enum.StrEnum):
    """Which library runs Inductor's frozen float32 linear layers (handlers/backends/inductor.py)."""

    AUTO = "auto"  # mkl on Intel CPUs, onednn on others
    MKL = "mkl"  # torch's default: MKL's packed GEMM
    ONEDNN = "onednn"  # oneDNN's linear, as AOTInductor and bfloat16 use


class Weights(enum.StrEnum):
    """How a model's linear weights are stored while it computes in its dtype."""

    DTYPE = "dtype"  # in the served dtype
    # Weight-only int8 (torchao, one scale per output channel), computed in the served dtype: half
    # of bfloat16's bytes, a quarter of float32's, read by every decode step.
    INT8 = "int8"


@dataclasses.dataclass(frozen=True)
class OptimizationSettings:
    # Not a setting: tells int8 quantizers which presets fit (attention blocks need their own).
    transformer: typing.ClassVar[bool] = False
    # Not a setting: the `weights` a task's handler serves (a variant's overlay may name any).
    weight_formats: typing.ClassVar[frozenset[Weights]] = frozenset(Weights)

    backend: Backend = Backend.INDUCTOR
    mode: CompileMode = CompileMode.DEFAULT
    dtype: DType = DType.FLOAT32
    # A language model's linear weights: `int8` stores them in 8 bits, computed in `dtype`
    # (handlers/generation/quantized.py), judged by the accuracy guard like a reduced dtype.
    weights: Weights = Weights.DTYPE
    # backend inductor: MKL's GEMM picks its code path by CPU vendor, not by ISA; on an AMD EPYC
    # with AVX-512 oneDNN's is faster (docs/backends.md).
    linear_kernel: LinearKernel = LinearKernel.AUTO
    # NHWC lets oneDNN pick its blocked convolution kernels without reorders (CNNs only).
    channels_last: bool = False
    # A failed compile stops the worker unless this asks for eager instead.
    fallback_to_eager: bool = False
    # One ITT range per inference call, visible in VTune; no cost without a collector.
    itt: bool = True
    # Warm-up calls per batch size after the compiling one.
    warmup_iterations: int = 2
    # The accuracy guard's limit (handlers/accuracy.py): the backend's answers against eager's, by
    # the task's metric; above it the build refuses the variant and a worker refuses to start (or
    # runs eager when fallback_to_eager). null = the precision's and task's (accuracy.TOLERANCES).
    accuracy_tolerance: float | None = None
    # backend aoti: one package per batch size, compiled by `make archive` (static shapes are
    # fastest); serving pads each batch up to the next of these sizes.
    aoti_batch_sizes: tuple[int, ...] = (1,)

    def torchserve_keys(self) -> dict[str, typing.Any]:
        """TorchServe model-config keys these settings need (kit/models.py puts them in the
        model's model-config.yaml, over what the model file says)."""
        return {}

    @property
    def single_worker(self) -> bool:
        """Whether TorchServe must give the model one worker (kit/plan.py plans it so)."""
        return False

    def __post_init__(self) -> None:
        if self.warmup_iterations < 0:
            raise SettingsError(f"warmup_iterations must be >= 0, got {self.warmup_iterations}")
        if self.accuracy_tolerance is not None and not self.accuracy_tolerance > 0:
            raise SettingsError(f"accuracy_tolerance must be > 0 or null, got {self.accuracy_tolerance}")
        if not self.aoti_batch_sizes or any(size < 1 for size in self.aoti_batch_sizes):
            raise SettingsError(f"aoti_batch_sizes must be a non-empty list of sizes >= 1, got {self.aoti_batch_sizes}")
        if self.weights not in self.weight_formats:
            raise SettingsError(
                f"weights {self.weights.value!r} (weight-only quantization) serves a language model "
                f"(task text-generation), not this task; for int8 here choose dtype int8 (aoti-int8, openvino-int8)"
            )
        served = BACKENDS[self.backend].dtypes
        if self.dtype not in served:
            raise SettingsError(
                f"backend {self.backend.value!r} does not serve dtype {self.dtype.value!r} (it serves "
                f"{', '.join(sorted(d.value for d in served))}); for {self.dtype.value} choose backend "
                f"{', '.join(backends_serving(self.dtype))}"
            )

    @property
    def traits(self) -> BackendTraits:
        return BACKENDS[self.backend]

    def serving_buckets(self, max_batch: int) -> list[int]:
        """The batch sizes warmed up and padded to for a TorchServe batchSize of max_batch."""
        return serving_buckets(max_batch, self.backend, self.aoti_batch_sizes)

    def varying_dims(self) -> dict[int, tuple[int, int]]:
        """Input dimensions (besides the batch) whose size varies while serving: dim -> (smallest, largest)."""
        return {}


@dataclasses.dataclass(frozen=True)
class ImageSettings(OptimizationSettings):
    weight_formats: typing.ClassVar[frozenset[Weights]] = frozenset({Weights.DTYPE})

    architecture: Architecture = Architecture.RESNET50
    channels_last: bool = True
    top_k: int = 5
    # Optional JSON file in the archive: {"0": "tench", ...} or ["tench", ...].
    labels_file: str = ""
    # handlers/image.py's Preprocessing; a Hugging Face model's come from its preprocessor_config.json.
    resize: int = Preprocessing.resize
    crop: int = Preprocessing.crop
    fit: Fit = Preprocessing.fit
    resample: Resample = Preprocessing.resample
    rescale: float = Preprocessing.rescale
    mean: tuple[float, ...] = Preprocessing.mean
    std: tuple[float, ...] = Preprocessing.std

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.crop <= self.resize:
            raise SettingsError(f"need 0 < crop <= resize, got crop={self.crop} resize={self.resize}")
        if self.top_k < 1:
            raise SettingsError(f"top_k must be >= 1, got {self.top_k}")
        if len(self.mean) != 3 or len(self.std) != 3 or not all(s > 0 for s in self.std):
            raise SettingsError(f"mean and std need 3 values (R, G, B), std > 0; got mean={self.mean} std={self.std}")

    @property
    def preprocessing(self) -> Preprocessing:
        return Preprocessing(self.resize, self.crop, self.fit, self.resample, self.rescale, self.mean, self.std)


class OverLength(enum.StrEnum):
    """What a text longer than max_length gets."""

    TRUNCATE = "truncate"  # cut to max_length, served (as transformers' pipelines do); logged
    REFUSE = "refuse"  # a 400 naming the limit: for models whose answer the cut would change


# Length buckets are laid every 8 tokens up to here (BERT's 512 positions); a model that takes
# longer texts serves them at its max_length, which its own files bound (model_store/huggingface.py).
LONGEST_TEXT = 512


@dataclasses.dataclass(frozen=True)
class TextSettings(OptimizationSettings):
    transformer: typing.ClassVar[bool] = True
    weight_formats: typing.ClassVar[frozenset[Weights]] = frozenset({Weights.DTYPE})

    architecture: Architecture = Architecture.BERT_CLASSIFIER
    # The longest text served (in tokens); longer ones get `over_length`.
    max_length: int = 128
    # A batch is padded to the smallest of these lengths (and max_length) that holds its longest
    # text: a short query costs a fraction of a max_length passage. Padding is masked, so the
    # answers do not change. [] pads every batch to max_length. Every 8 tokens: `make
    # bench-lengths` served a mix of lengths 1.07-1.32x faster than with (16, 32, 64), for seconds
    # more warm-up per worker; finer sets gained less than the rounds' spread, for twice the
    # warm-up and more (docs/benchmarks.md).
    length_buckets: tuple[int, ...] = tuple(range(8, LONGEST_TEXT, 8))
    over_length: OverLength = OverLength.TRUNCATE
    labels_file: str = ""
    # What the model's forward takes, in its order; the tokenizer gives each (tokenizer.json).
    input_names: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")
    pad_token: str = "[PAD]"
    # hf-feature-extractor only: token states -> one unit-length (normalize) vector.
    pooling: Pooling = Pooling.MEAN
    normalize: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_length < 8:
            raise SettingsError(f"max_length must be 8 tokens or more, got {self.max_length}")
        if any(length < 2 for length in self.length_buckets):
            raise SettingsError(f"length_buckets must be lengths >= 2 tokens, got {list(self.length_buckets)}")

    @functools.cached_property  # read for every batch served
    def lengths(self) -> tuple[int, ...]:
        """The lengths a batch is padded to, shortest first; the last is max_length."""
        # Without an attention mask the model attends to padding: its length changes the answer.
        if "attention_mask" not in self.input_names or not self.traits.varying_sizes:
            return (self.max_length,)
        return tuple(sorted({length for length in self.length_buckets if length < self.max_length} | {self.max_length}))

    def length_for(self, tokens: int) -> int:
        """The length a batch whose longest text has `tokens` tokens is padded to."""
        return next(length for length in self.lengths if length >= tokens)

    def varying_dims(self) -> dict[int, tuple[int, int]]:
        lengths = self.lengths
        return {1: (lengths[0], lengths[-1])} if len(lengths) > 1 else {}


class TensorType(enum.StrEnum):
    """The element types a tensor model's inputs may have (JSON numbers or booleans)."""

    FLOAT32 = "float32"
    INT64 = "int64"
    INT32 = "int32"
    BOOL = "bool"


@dataclasses.dataclass(frozen=True)
class TensorSettings(OptimizationSettings):
    """A torch.export program served as JSON numbers in, numbers out (handlers/tensor.py)."""

    weight_formats: typing.ClassVar[frozenset[Weights]] = frozenset({Weights.DTYPE})

    architecture: Architecture = Architecture.EXPORTED_PROGRAM
    # One entry per forward argument, in order: its shape without the batch dimension and its
    # element type. `make model` reads both from the program (model_store/exported.py).
    input_shapes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[TensorType, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.input_shapes or len(self.input_shapes) != len(self.input_dtypes):
            raise SettingsError(
                f"a tensor model needs input_shapes and input_dtypes, one per input (got {len(self.input_shapes)} "
                f"shapes, {len(self.input_dtypes)} dtypes); `make model` reads them from the program"
            )
        if any(size < 1 for shape in self.input_shapes for size in shape):
            raise SettingsError(f"input_shapes need sizes >= 1, got {self.input_shapes}")


# What a generative model's workers run: the backends with a generation engine (BackendTraits:
# eager or Inductor-compiled PyTorch on the kit's engine, or OpenVINO GenAI's continuous-batching
# pipeline on the IR `make archive` exports); float32 or bfloat16, on weights in that dtype or in
# int8 (`weights`).
GENERATION_BACKENDS = frozenset(b.value for b, traits in BACKENDS.items() if traits.generation_engine)
GENERATION_DTYPES = frozenset({"float32", "bfloat16"})


class Batching(enum.StrEnum):
    """How TorchServe's frontend hands a language model's requests to its worker, whose engine
    batches them (handlers/replies.py, handlers/worker.py)."""

    # asyncCommunication: each request as it arrives; the worker answers when it likes. The
    # frontend never tells the worker that a client went away.
    ASYNC = "async"
    # continuousBatching: a batch of the requests the worker holds, answered once a step. A
    # request whose client went away is left out of the next batch, and its sequence ends. A
    # model has one worker: the frontend holds a model's queue while one of its workers waits for
    # a request, and another's steps would wait with it (wlm/Model.pollInferJob).
    CONTINUOUS = "continuous"


# The frontend's batch under continuousBatching: every request it has for the model's one worker
# (far more than an engine holds), as asyncCommunication hands them over, so that the engine
# decides which wait and which get its 503 (max_waiting), not the frontend's queue. Gathered for
# at most 1 ms when the worker has none: it takes what is there.
CONTINUOUS_BATCH_SIZE = 65536
CONTINUOUS_BATCH_DELAY_MS = 1


@dataclasses.dataclass(frozen=True)
class GenerationSettings(OptimizationSettings):
    """A causal language model served many sequences at once (handlers/generation/)."""

    transformer: typing.ClassVar[bool] = True
    # What a preset may serve over the archive's settings (ServeConfig.model_settings): how the
    # engine schedules and drafts; not what the archive was built with or the memory plan sized
    # (context_length, max_sequences, dtype, ...).
    SERVED: typing.ClassVar[frozenset[str]] = frozenset(
        {"prompt_lookup", "prefill_chunk", "prefix_caching", "max_waiting", "max_new_tokens"}
    )

    architecture: Architecture = Architecture.HF_CAUSAL_LM
    # Tokens a sequence holds, prompt and answer together: the KV cache has this many positions
    # per sequence. `make model` sets the model's own (config.json, the tokenizer); lower it to
    # fit more sequences into memory.
    context_length: int = 2048
    # Sequences generated at once by each worker (a step computes them all); more wait in the
    # queue. The KV cache has a row of context_length positions for each, resident as written
    # (handlers/generation/cache.py): memory grows with the tokens the load holds.
    max_sequences: int = 16
    # A request that names no max_new_tokens (max_tokens) gets this many at most.
    max_new_tokens: int = 256
    # Requests waiting for a free sequence beyond which a request gets a 503.
    max_waiting: int = 64
    # Prompt tokens a step computes at most beside the sequences decoding (chunked prefill): a
    # long prompt, or many at once, then delays every stream by this many tokens' compute a step,
    # not by all of them. 0: each prompt whole as it is admitted. null: the most that keep such a
    # step within 3 decode steps, timed at warm-up (handlers/generation/chunking.py; OpenVINO's
    # pipeline: 256): a shorter inter-token tail for fewer tokens a second on a small machine.
    prefill_chunk: int | None = 256
    # A prompt that begins with blocks of tokens another request left in the cache (a shared
    # system prompt, a conversation's earlier turns) computes only the rest (prefix caching).
    prefix_caching: bool = True
    # TorchServe's protocol for the requests (Batching): `continuous` ends a sequence whose client
    # went away, with one worker; `async` runs it to its end, with a worker per L3 domain.
    batching: Batching = Batching.CONTINUOUS
    # The accuracy guard of a reduced precision (handlers/generation/agreement.py): this many
    # held-out prompts (yours, make model ... SAMPLES=, else the kit's sentences), each continued
    # by this many tokens. `accuracy_tolerance` is the largest mean next-token distance, and
    # this the smallest share of greedy tokens equal to the float model's (null: the dtype's).
    accuracy_prompts: int = 8
    accuracy_tokens: int = 32
    accuracy_min_match_rate: float | None = None
    # How the model writes tool calls (handlers/generation/tools.py): null, what its chat template
    # writes (Hermes/Qwen <tool_call>, Mistral [TOOL_CALLS], Llama 3 <|python_tag|>); name it
    # where the template shows none of them.
    tool_format: Syntax | None = None
    # Prompt lookup (handlers/generation/lookup.py): a sequence's next tokens guessed from its own
    # text, up to this many, checked in one forward; the answer is plain decoding's, sooner where
    # the answer repeats its prompt (summaries, edits, extraction, code). 0: off. The kit's own
    # engine only (OpenVINO GenAI's pipeline: off, said at READY).
    prompt_lookup: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend.value not in GENERATION_BACKENDS:
            raise SettingsError(
                f"a generative model is served by backend {' or '.join(sorted(GENERATION_BACKENDS))}, "
                f"not {self.backend.value!r}"
            )
        if self.dtype.value not in GENERATION_DTYPES:
            raise SettingsError(
                f"a generative model is served at dtype {' or '.join(sorted(GENERATION_DTYPES))}, not {self.dtype.value!r}"
            )
        for name in ("context_length", "max_sequences", "max_new_tokens", "accuracy_prompts", "accuracy_tokens"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be 1 or more, got {getattr(self, name)}")
        for name in ("max_waiting", "prefill_chunk", "prompt_lookup"):
            if (getattr(self, name) or 0) < 0:
                raise SettingsError(f"{name} must be 0 or more, got {getattr(self, name)}")
        rate = self.accuracy_min_match_rate
        if rate is not None and not 0 <= rate <= 1:
            raise SettingsError(f"accuracy_min_match_rate must be between 0 and 1 or null, got {rate}")

    @classmethod
    def served_over(
        cls, section: typing.Mapping[str, typing.Any] | None, served: typing.Mapping[str, typing.Any]
    ) -> GenerationSettings:
        """The settings of a model file's `handler:` section with a preset's served over them;
        SettingsError naming a served key outside SERVED or a wrong value."""
        if outside := sorted(set(served) - cls.SERVED):
            raise SettingsError(
                f"model_settings cannot serve {outside} over the archive's; it serves {sorted(cls.SERVED)}"
            )
        return parse_settings(cls, {**(section or {}), **served})

    @property
    def single_worker(self) -> bool:
        return self.batching is Batching.CONTINUOUS

    @property
    def precision(self) -> str:
        """What it computes in, and on what weights when they differ: "bfloat16", "bfloat16 on int8 weights"."""
        if self.weights is Weights.DTYPE:
            return self.dtype.value
        return f"{self.dtype.value} on {self.weights.value} weights"

    def torchserve_keys(self) -> dict[str, typing.Any]:
        if self.batching is Batching.ASYNC:
            return {"asyncCommunication": True, "continuousBatching": False}
        return {
            "continuousBatching": True,
            "asyncCommunication": False,
            "batchSize": CONTINUOUS_BATCH_SIZE,
            "maxBatchDelay": CONTINUOUS_BATCH_DELAY_MS,
        }
