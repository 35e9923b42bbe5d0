"""Turn an eval-mode model into the fastest callable its settings ask for, warmed up and checked.

    optimized = optimize(model, settings, examples=[(x1,), (x4,)])
    logits = optimized(x4)   # converts to the prepared layout, then runs

Order is fixed and explicit: layout (channels-last) -> precision (autocast) -> the backend's
build (handlers/backends/, chosen by `settings.backend`) -> warm-up of every batch shape in
inference mode, the grad mode the server uses -> the accuracy guard against eager. The first
call per shape is where torch.compile really compiles, so it is timed apart from the steady
warm-up calls. Precompiled backends load what `make archive` compiled from the archive.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from handlers.accuracy import (
    AccuracyError,
    Answer,
    Reference,
    require_accuracy,
    require_judged_arithmetic,
    tolerance,
)
from handlers.backends import Backend, DType, builder
from handlers.backends.common import (
    BackendUnavailable,
    BuildSpec,
    CompileError,
    Inputs,
    Runner,
    prepare,
    require_dtype_supported,
    short_reason,
    to_layout,
)
from handlers.loaders import load_model
from handlers.settings import OptimizationSettings

log = logging.getLogger(__name__)


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
    # Difference to eager on the check inputs (handlers/accuracy.py), None when the guard did
    # not run: eager itself, or eager after a fallback.
    accuracy_error: float | None = None

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


class RecompileWatch:
    """Graphs Dynamo compiles after warm-up: every shape served was compiled before the first
    request, so a new graph while serving means a guard failed and a request waited for the
    compiler. Logged, so a test or a user sees it (the classifiers' and the language model's)."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.graphs = graphs_compiled()

    def check(self, during: str = "") -> None:
        graphs = graphs_compiled()
        if graphs != self.graphs:
            log.warning(
                "%s: recompiled while serving (%d new graph(s)%s); run with TORCH_LOGS=recompiles to see which guard failed",
                self.model_name,
                graphs - self.graphs,
                f", {during}" if during else "",
            )
            self.graphs = graphs


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


def optimize(
    model: nn.Module | None,
    settings: OptimizationSettings,
    examples: Sequence[Inputs],
    model_dir: Path | None = None,
    checks: Sequence[Inputs] = (),
    answer: Answer = Answer.VALUES,
) -> OptimizedModel:
    """`examples` are warmed up (one per served batch shape); the accuracy guard compares
    `checks` (default: the examples) with eager, judging what a client is answered (`answer`:
    a classifier's handler passes PROBABILITIES; VALUES judges the raw output, the stricter). int8 needs realistic checks: random token ids
    are far outside what it was calibrated on. A precompiled backend checks against the archive's
    Reference instead and needs no `model` (None: loaded only if it falls back to eager); so does
    one compiled here at reduced precision, whose archive ships the build's evidence."""
    require_dtype_supported(settings.dtype)
    precompiled = settings.traits.precompiled
    if model is None and not precompiled:
        raise ValueError(f"backend {settings.backend.value!r} compiles the eager model: pass it")
    prepared = None if model is None else prepare(model, settings)
    spec = BuildSpec(
        to_layout(examples[0], settings.channels_last), tuple(inputs[0].shape[0] for inputs in examples), model_dir
    )
    try:
        if settings.dtype is DType.INT8:  # int8 is precompiled: judged by the build, on the build's CPU
            require_judged_arithmetic(spec.archive(), settings.backend.value)
        run = builder(settings.backend)(prepared, settings, spec)
        optimized = warm_up(
            OptimizedModel(run, settings.backend, settings.channels_last), examples, settings.warmup_iterations
        )
        if settings.backend is Backend.EAGER:
            return optimized  # the reference itself
        if precompiled or Reference.shipped(model_dir):  # judged on the evidence the build shipped
            reference = Reference.load(spec.archive())
        else:
            # Float32 eager, whatever the precision: the answers users would get without the kit.
            reference = Reference.of(model, checks or examples, settings.channels_last)
        limit = tolerance(settings, answer)
        error = require_accuracy(optimized, reference, settings.backend.value, answer, limit)
        return dataclasses.replace(optimized, accuracy_error=error)
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
            prepared = prepare(load_model(settings, spec.archive()), settings)
        eager = OptimizedModel(prepared, Backend.EAGER, settings.channels_last, fallback_reason=reason)
        return warm_up(eager, examples, settings.warmup_iterations)
