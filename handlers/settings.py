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
from handlers.typed_config import SettingsError


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
