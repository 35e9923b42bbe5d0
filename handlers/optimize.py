"""Turn an eval-mode model into the fastest callable its settings ask for, warmed up.

    optimized = optimize(model, settings, examples=[(x1,), (x4,)])
    logits = optimized(x4)   # converts to the prepared layout, then runs

Order is fixed and explicit: layout (channels-last) -> precision (autocast) -> backend
(eager | inductor | ipex) -> warm-up of every batch shape in inference mode, the grad mode
the server uses. The first call per shape is where torch.compile really compiles, so it is
timed apart from the steady warm-up calls. Precompiled backends (aoti, openvino) load what
`make archive` compiled from the archive directory instead.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from handlers.loaders import load_model
from handlers.settings import PRECOMPILED, Backend, DType, OptimizationSettings

log = logging.getLogger(__name__)

Inputs = tuple[torch.Tensor, ...]
Runner = Callable[..., torch.Tensor]
REFERENCE_FILE = "reference.pt"  # precompiled archives: the accuracy guard's Reference

# dtypes reached by autocast at run time; int8 is quantized at archive time, float32 is as is.
AUTOCAST_DTYPES = {DType.BFLOAT16: torch.bfloat16}


class CompileError(RuntimeError):
    """The configured backend failed on the warm-up inputs and no fallback was allowed."""


class AccuracyError(CompileError):
    """The backend ran but its outputs differ from eager beyond the configured tolerance."""


class BackendUnavailable(RuntimeError):
    """The configured backend cannot run in this Python environment."""


class Autocast(nn.Module):
    """Runs `inner` under CPU autocast and hands float32 back, so postprocessing is dtype-agnostic."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.inner = inner
        self.dtype = dtype

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=self.dtype):
            return self.inner(*inputs).float()


def to_layout(inputs: Inputs, channels_last: bool) -> Inputs:
    """Inputs in the memory format the model was prepared for (4-D tensors only)."""
    if not channels_last:
        return inputs
    return tuple(t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t for t in inputs)


def prepare(model: nn.Module, settings: OptimizationSettings) -> nn.Module:
    if settings.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if settings.dtype in AUTOCAST_DTYPES:
        model = Autocast(model, AUTOCAST_DTYPES[settings.dtype])
    return model


@dataclasses.dataclass(frozen=True)
class Target:
    """What a backend builder may need besides the model: the served shapes and the archive."""

    example: Inputs  # the first warm-up example, in the served layout
    batch_sizes: tuple[int, ...]  # every batch size that will be served
    model_dir: Path | None = None  # the extracted archive: precompiled backends load from it

    def archive(self) -> Path:
        if self.model_dir is None:
            raise BackendUnavailable("a precompiled backend (aoti, openvino) runs from a built archive only")
        return self.model_dir


def inductor_options(settings: OptimizationSettings) -> dict:
    """Inductor's options for the settings' mode (torch.compile takes `mode` or `options`, not both)."""
    options = torch._inductor.list_mode_options(settings.mode.value)
    options.pop("triton.cudagraphs", None)  # a GPU feature; meaningless on CPU
    return options


def compile_with_inductor(model: nn.Module, settings: OptimizationSettings, target: Target) -> Runner:
    # Freezing (weights as constants: conv-BN folding, prepacked oneDNN weights) is read when AOT
    # Autograd compiles, lazily inside the first calls and outside torch.compile(options=...)'s
    # scope: passed there it is silently ignored (torch 2.13). A worker process serves one model,
    # so it is set process-wide: recompiles get it too, serving calls pay nothing for it, and the
    # minifier's repro scripts (which record the global config) reproduce it.
    torch._inductor.config.freezing = True
    options = inductor_options(settings)
    # dynamic=False: every served shape is warmed up here, so static kernels are safe and fastest.
    return torch.compile(model, backend="inductor", options=options, dynamic=False)


def run_eager(model: nn.Module, settings: OptimizationSettings, target: Target) -> Runner:
    return model


def optimize_with_ipex(model: nn.Module, settings: OptimizationSettings, target: Target) -> Runner:
    from handlers.ipex_backend import trace_with_ipex  # imports IPEX: only in .venv-ipex

    return trace_with_ipex(model, settings, target.example)


def compile_with_ipex(model: nn.Module, settings: OptimizationSettings, target: Target) -> Runner:
    from handlers.ipex_backend import compile_with_ipex_backend

    return compile_with_ipex_backend(model, settings)


def load_aoti_packages(model: nn.Module, settings: OptimizationSettings, target: Target) -> Runner:
    from handlers.aoti import load_packages

    return load_packages(target.archive(), settings, target.batch_sizes)


def load_openvino_ir(model: nn.Module, settings: OptimizationSettings, target: Target) -> Runner:
    from handlers.openvino_backend import load_ir

    return load_ir(target.archive(), settings)


# Backend -> builder(prepared model, settings, target). The model is the eager reference for
# precompiled backends, which load their artifact instead.
BACKENDS: dict[Backend, Callable[[nn.Module, OptimizationSettings, Target], Runner]] = {
    Backend.EAGER: run_eager,
    Backend.INDUCTOR: compile_with_inductor,
    Backend.IPEX: optimize_with_ipex,
    Backend.IPEX_COMPILE: compile_with_ipex,
    Backend.AOTI: load_aoti_packages,
    Backend.OPENVINO: load_openvino_ir,
}


@dataclasses.dataclass(frozen=True)
class OptimizedModel:
    run: Runner
    backend: Backend  # what actually runs: eager after an allowed fallback
    channels_last: bool = False
    fallback_reason: str = ""
    compile_seconds: float = 0.0  # first call per shape: tracing + code generation
    warmup_seconds: float = 0.0  # the steady calls after it
    # Inductor's FX-graph cache during warm-up. Frozen graphs bypass it (their weights are
    # constants), so a restart still lowers the graph; the C++ kernels come from the on-disk
    # cache either way.
    cache_hits: int = 0
    cache_misses: int = 0
    cache_bypasses: int = 0
    accuracy_error: float = 0.0  # max |out - eager| / (1 + |eager|) over the warm-up inputs

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        # Warm-up and serving both come through here, under inference_mode: the compiled
        # graph's guards (strides, inference-tensor-ness) then match and nothing recompiles.
        return self.run(*to_layout(inputs, self.channels_last))


def dynamo_counters() -> dict[str, collections.Counter]:
    # Importing Dynamo takes ~1.5 s of a worker's start: a process that never imported it (the
    # precompiled backends, eager) has compiled nothing, so its counters would all be zero.
    if "torch._dynamo" not in sys.modules:
        return collections.defaultdict(collections.Counter)
    from torch._dynamo.utils import counters

    return counters


def fx_graph_cache_counts() -> tuple[int, int, int]:
    inductor = dynamo_counters()["inductor"]
    return inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"], inductor["fxgraph_cache_bypass"]


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process so far (recompiles included)."""
    return dynamo_counters()["stats"]["unique_graphs"]


def warm_up(optimized: OptimizedModel, examples: Sequence[Inputs], iterations: int) -> OptimizedModel:
    compile_seconds = warmup_seconds = 0.0
    before = fx_graph_cache_counts()
    with torch.inference_mode():
        for inputs in examples:
            start = time.perf_counter()
            optimized(*inputs)
            compile_seconds += time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(iterations):
                optimized(*inputs)
            warmup_seconds += time.perf_counter() - start
    hits, misses, bypasses = (after - start for after, start in zip(fx_graph_cache_counts(), before, strict=True))
    return dataclasses.replace(
        optimized,
        compile_seconds=compile_seconds,
        warmup_seconds=warmup_seconds,
        cache_hits=hits,
        cache_misses=misses,
        cache_bypasses=bypasses,
    )


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / (1 + |expected|): absolute near zero, relative for large values."""
    return ((actual.float() - expected.float()).abs() / (1 + expected.float().abs())).max().item()


def cosine_distance(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """1 - the lowest cosine similarity between matching output rows: direction, not scale."""
    cosine = torch.nn.functional.cosine_similarity(actual.float().flatten(1), expected.float().flatten(1), dim=1)
    return 1.0 - cosine.min().item()


# How far a backend may be from eager, per dtype (tolerances in settings.ACCURACY_TOLERANCE).
# int8 is compared with the float32 model: element-wise error scales with the logits, while
# the direction of the output row is what ranking, top-k and embeddings depend on.
ERROR_METRICS: dict[DType, Callable[[torch.Tensor, torch.Tensor], float]] = {
    DType.FLOAT32: relative_error,
    DType.BFLOAT16: relative_error,
    DType.INT8: cosine_distance,
}


def short_reason(error: BaseException) -> str:
    """`Type: first line of the message`, for logs and error messages."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


@dataclasses.dataclass(frozen=True)
class Reference:
    """The accuracy guard's input batches and what the float eager model returns for them.

    Backends compiled in the worker compute it there. Precompiled ones ship it in the archive
    (handlers/precompile.py runs the same eager model), so their workers never build that model:
    for BERT that is transformers' import, 440 MB of float weights and the eager runs, ~3 s of
    a worker's start on one core.
    """

    inputs: list[Inputs]
    outputs: list[torch.Tensor]

    @classmethod
    def of(cls, model: nn.Module, inputs: Sequence[Inputs], channels_last: bool) -> Reference:
        with torch.inference_mode():
            return cls(list(inputs), [model(*to_layout(batch, channels_last)) for batch in inputs])

    def save(self, model_dir: Path) -> None:
        torch.save({"inputs": self.inputs, "outputs": self.outputs}, model_dir / REFERENCE_FILE)

    @classmethod
    def load(cls, model_dir: Path) -> Reference:
        path = model_dir / REFERENCE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing from the archive; rebuild it with `make archive`")
        saved = torch.load(path, map_location="cpu", weights_only=True)
        return cls([tuple(batch) for batch in saved["inputs"]], saved["outputs"])


def accuracy_error(optimized: OptimizedModel, reference: Reference, dtype: DType = DType.FLOAT32) -> float:
    """Largest difference to eager on the reference inputs, by the dtype's metric."""
    with torch.inference_mode():
        pairs = zip(reference.inputs, reference.outputs, strict=True)
        return max(ERROR_METRICS[dtype](optimized(*inputs), expected) for inputs, expected in pairs)


def check_accuracy(optimized: OptimizedModel, reference: Reference, settings: OptimizationSettings) -> OptimizedModel:
    error = accuracy_error(optimized, reference, settings.dtype)
    if not error <= settings.tolerance:  # also catches NaN
        raise AccuracyError(
            f"backend {settings.backend.value!r} differs from eager by {error:.3g} on the check inputs "
            f"(tolerance {settings.tolerance:.3g}); run `make doctor` on this model to find the failing "
            "component, or set `fallback_to_eager: true` in model-config.yaml"
        )
    return dataclasses.replace(optimized, accuracy_error=error)


def optimize(
    model: nn.Module | None,
    settings: OptimizationSettings,
    examples: Sequence[Inputs],
    model_dir: Path | None = None,
    checks: Sequence[Inputs] = (),
) -> OptimizedModel:
    """`examples` are warmed up (one per served batch shape); the accuracy guard compares
    `checks` (default: the examples) with eager. int8 needs realistic checks: random token ids
    are far outside what it was calibrated on. A precompiled backend checks against the archive's
    Reference instead and needs no `model` (None: loaded only if it falls back to eager)."""
    precompiled = settings.backend in PRECOMPILED
    if model is None and not precompiled:
        raise ValueError(f"backend {settings.backend.value!r} compiles the eager model: pass it")
    prepared = None if model is None else prepare(model, settings)
    target = Target(
        to_layout(examples[0], settings.channels_last), tuple(inputs[0].shape[0] for inputs in examples), model_dir
    )
    try:
        run = BACKENDS[settings.backend](prepared, settings, target)
        optimized = warm_up(
            OptimizedModel(run, settings.backend, settings.channels_last), examples, settings.warmup_iterations
        )
        if settings.backend is Backend.EAGER:
            return optimized
        if precompiled:
            reference = Reference.load(target.archive())
        else:
            reference = Reference.of(prepared, checks or examples, settings.channels_last)
        return check_accuracy(optimized, reference, settings)
    except BackendUnavailable:
        raise  # a missing environment is a configuration error, never silently eager
    except Exception as error:  # noqa: BLE001 - any compiler failure qualifies
        reason = short_reason(error)
        if not settings.fallback_to_eager:
            if isinstance(error, AccuracyError):
                raise
            raise CompileError(
                f"backend {settings.backend.value!r} failed during warm-up ({reason}); if the model itself is "
                "fine, choose `backend: eager` or set `fallback_to_eager: true` in model-config.yaml"
            ) from error
        log.warning("backend %s failed, falling back to eager as configured: %s", settings.backend.value, reason)
        if prepared is None:
            prepared = prepare(load_model(settings.architecture, target.archive()), settings)
        eager = OptimizedModel(prepared, Backend.EAGER, settings.channels_last, fallback_reason=reason)
        return warm_up(eager, examples, settings.warmup_iterations)
