"""The shared TorchServe handler: load -> optimize -> warm up in `initialize`, then batched serving.

A task handler subclasses `OptimizedHandler`, sets `settings_class` and `answer`, and
implements what is the task's own:
    setup(model_dir)         load what decoding needs (tokenizer, labels); optional
    decode(request)          one request -> unbatched tensors; InvalidInput (a 400) for a bad body
    format(output_row)       one output row -> JSON
    example(batch_size)      warm-up inputs in the exact shapes and dtypes served
    synthetic_body(index)    a representative request body, for a model given no samples
    collate(items, bucket)   decoded items -> one batch (default: stack and pad rows); optional
A handler that serves another API at an extra URL path (OpenAI's embeddings) overrides, optionally:
    decode_request(request, path)   one request -> its rows, and what its reply needs (default:
                                    decode(request) on the kit's own path, a 404 on any other)
    reply(request, outputs, path)   that request's output rows -> its JSON (default: format(row))
    refusal(error, path)            a refused request's JSON (default: the kit's error shape)
The base owns the rest: the model's optimization and warm-up, batching, the stage clock, ITT
ranges, errors. Sample inputs are one object (`self.samples`, handlers/samples.py) built from
decode, collate and synthetic_body. A bad request gets a 400 (an unknown path a 404) with a
message; the rest of its batch is still served.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from ts.utils.util import PredictionException

from handlers.accuracy import Answer
from handlers.backends.common import Inputs
from handlers.diagnostics import RequestProfiler, op_ranges
from handlers.itt import inference_range
from handlers.loaders import load_model
from handlers.optimize import RecompileWatch, optimize
from handlers.payload import (
    JSON,
    STREAM_NEXT,
    URL_PATH,
    InvalidInput,
    NotFound,
    error_body,
    over_grpc,
    status_phrase,
)
from handlers.samples import Samples, UserSamples
from handlers.settings import OptimizationSettings
from handlers.stages import FAILED, OK, Stage, StageClock, StoppedClock, now
from handlers.switches import Diagnostics, WorkerDirs
from handlers.typed_config import parse_settings

log = logging.getLogger(__name__)


def collate(items: Sequence[Inputs], bucket: int) -> Inputs:
    """Stack per-request tensors and zero-pad the batch up to a compiled bucket size."""
    stacked = [torch.stack(parts) for parts in zip(*items, strict=False)]
    missing = bucket - len(items)
    if missing:
        stacked = [torch.cat([t, t.new_zeros((missing, *t.shape[1:]))]) for t in stacked]
    return tuple(stacked)


@dataclasses.dataclass(frozen=True)
class Decoded:
    """One request, decoded: its rows, and what its API asked of the answer besides them."""

    rows: list[Inputs]
    asked: Any = None


@dataclasses.dataclass
class Batch:
    """What flows from preprocess through inference to postprocess for one TorchServe batch."""

    size: int
    paths: list[str]  # each request's url_path: which API it speaks
    decoded: dict[int, Decoded]  # by request index
    items: list[Inputs]  # every decoded request's rows, in request order
    errors: dict[int, InvalidInput]
    outputs: torch.Tensor | None = None  # aligned with `items`


class OptimizedHandler(abc.ABC):
    """TorchServe calls initialize(context) once, then handle(requests, context) per batch.

    Not a subclass of TorchServe's BaseHandler: importing that module imports every optional
    runtime it can find (openvino.torch alone pulls in Dynamo's backends), ~2-3 s of every
    worker's start, and nothing here uses it.
    """

    settings_class: type[OptimizationSettings] = OptimizationSettings
    # What a client is answered, which the accuracy guard judges: a classifier's handler answers
    # probabilities (agreement then reports top-1 and probability differences too).
    answer: Answer = Answer.VALUES
    samples: Samples  # set by load_files: the user's samples, else the task's synthetic ones
    initialized = False
    diagnostics = Diagnostics()  # a handler used outside TorchServe (bench, tests) has none set

    def initialize(self, context) -> None:
        self.context = context
        self.manifest = context.manifest
        self.model_name = context.model_name
        self.model_dir = context.system_properties["model_dir"]
        self.settings = parse_settings(self.settings_class, (context.model_yaml_config or {}).get("handler"))
        self.buckets = self.settings.serving_buckets(int(context.system_properties.get("batch_size") or 1))
        self.diagnostics, dirs = Diagnostics.from_environment(), WorkerDirs.from_environment()
        self.stages = StageClock(self.model_name, dirs.stages) if self.diagnostics.stage_metrics else StoppedClock()
        self.profiler = RequestProfiler(self.diagnostics.profile_requests, dirs.profile, self.model_name)
        self.load_files(self.model_dir)

        start = time.perf_counter()
        # A precompiled backend's artifact is the model, and its accuracy guard's Reference (inputs
        # and float outputs) ships with it: neither the float model nor check inputs are built here.
        if self.settings.traits.precompiled:
            model, checks = None, []
        else:
            model, checks = load_model(self.settings, self.model_dir), self.samples.checks(self.buckets[0])
        load_seconds = time.perf_counter() - start
        self.optimized = optimize(
            model,
            self.settings,
            [inputs for size in self.buckets for inputs in self.examples(size)],
            Path(self.model_dir),
            checks,
            self.answer,
        )
        self.recompiles = RecompileWatch(self.model_name)
        self.shapes_served: set[tuple[int, ...]] = set()
        log.info(
            "%s ready: backend=%s load=%.1fs compile=%.1fs warmup=%.1fs batch_buckets=%s threads=%d "
            "fx_graph_cache=hits:%d,misses:%d,bypasses:%d accuracy_error=%s",
            self.model_name,
            self.optimized.backend.value,
            load_seconds,
            self.optimized.compile_seconds,
            self.optimized.warmup_seconds,
            self.buckets,
            torch.get_num_threads(),
            self.optimized.cache_hits,
            self.optimized.cache_misses,
            self.optimized.cache_bypasses,
            "n/a" if self.optimized.accuracy_error is None else f"{self.optimized.accuracy_error:.2g}",
        )
        self.initialized = True

    @property
    def classifier(self) -> bool:
        return self.answer is Answer.PROBABILITIES

    def load_files(self, model_dir: str) -> None:
        """What decoding and the samples need from the archive (also for a bare handler)."""
        self.setup(model_dir)
        self.samples = Samples(
            lambda body: self.decode({"body": body}),
            self.collate,
            self.synthetic_body,
            UserSamples.load(Path(model_dir)),
        )

    # -- task hooks ---------------------------------------------------------------------------
    def setup(self, model_dir: str) -> None:  # noqa: B027 - an optional hook, not abstract
        """Load what preprocessing needs (tokenizer, labels). Default: nothing."""

    @abc.abstractmethod
    def decode(self, request: dict[str, Any]) -> Inputs:
        """One request -> unbatched input tensors; raise InvalidInput for a bad body."""

    @abc.abstractmethod
    def example(self, batch_size: int) -> Inputs:
        """Batched warm-up inputs with the exact shapes and dtypes served."""

    def examples(self, batch_size: int) -> list[Inputs]:
        """Warm-up inputs of every shape served at this batch size (the handler pads to them)."""
        return [self.example(batch_size)]

    def collate(self, items: Sequence[Inputs], bucket: int) -> Inputs:
        """Decoded requests -> one batch of `bucket` rows, in a shape `examples` warmed up."""
        return collate(items, bucket)

    @abc.abstractmethod
    def synthetic_body(self, index: int) -> bytes:
        """The kit's representative request body number `index` (handlers/calibration.py), for a
        model given no samples of its own: a client could send it as it is."""

    @abc.abstractmethod
    def format(self, output: torch.Tensor) -> Any:
        """One output row -> a JSON-serialisable response."""

    def decode_request(self, request: dict[str, Any], path: str) -> Decoded:
        """One request -> its rows, by the API its URL path names."""
        if path:
            raise NotFound(f"no API at {path!r}: this model answers at /predictions/{self.model_name}")
        return Decoded([self.decode(request)])

    def reply(self, request: Decoded, outputs: torch.Tensor, path: str) -> Any:
        """One request's output rows -> its response."""
        return self.format(outputs[0])

    def refusal(self, error: InvalidInput, path: str) -> Any:
        """A refused request's response body."""
        return error_body(str(error), error.code)

    # -- TorchServe's preprocess -> inference -> postprocess ----------------------------------
    def handle(self, requests: list[dict[str, Any]], context) -> list[Any]:
        self.context = context
        count = len(requests)
        start = now()
        try:
            batch = self.preprocess(requests)
            decoded = now()
            self.inference(batch)
            inferred = now()
        except Exception:
            self.stages.answered(FAILED, count)  # TorchServe answers each request the error
            raise
        responses = self.postprocess(batch)
        self.stages.record(Stage.DECODE, start, decoded, count)
        self.stages.record(Stage.MODEL, decoded, inferred, count)
        self.stages.record(Stage.FORMAT, inferred, now(), count)
        return responses

    def preprocess(self, requests: list[dict[str, Any]]) -> Batch:
        paths = [
            str(self.context.get_request_header(index, URL_PATH) or "").strip("/") for index in range(len(requests))
        ]
        batch = Batch(size=len(requests), paths=paths, decoded={}, items=[], errors={})
        for index, request in enumerate(requests):
            try:
                batch.decoded[index] = decoded = self.decode_request(request, paths[index])
            except InvalidInput as error:
                batch.errors[index] = error
                continue
            batch.items += decoded.rows
        return batch

    def inference(self, batch: Batch) -> Batch:
        # One request is one row, except on an API that takes several texts per request: rows
        # past the largest compiled batch run in more forwards.
        largest = self.buckets[-1]
        outputs = [self.forward(batch.items[start : start + largest]) for start in range(0, len(batch.items), largest)]
        if outputs:
            batch.outputs = torch.cat(outputs)
        return batch

    def forward(self, items: list[Inputs]) -> torch.Tensor:
        count = len(items)
        bucket = next(size for size in self.buckets if size >= count)
        inputs = self.collate(items, bucket)
        with (
            torch.inference_mode(),
            inference_range(self.model_name, count, self.settings.itt),
            self.profiler.record(),
            op_ranges(self.diagnostics.itt_ops),
        ):
            outputs = self.optimized(*inputs)[:count]
        self.recompiles.check(f"batch of {count} padded to {bucket}")
        shape = tuple(inputs[0].shape)
        if shape not in self.shapes_served:  # once per shape: shows batching and length buckets at work, cheaply
            self.shapes_served.add(shape)
            log.info(
                "%s: first batch at bucket %d, shape %s (%d request(s))", self.model_name, bucket, list(shape), count
            )
        return outputs

    def postprocess(self, batch: Batch) -> list[Any]:
        grpc = [over_grpc(self.context.get_all_request_header(index) or {}) for index in range(batch.size)]
        if len(batch.errors) == batch.size and all(grpc):
            # TorchServe's gRPC path ignores per-request status codes (GRPCJob.response answers
            # OK with the body): only a batch-level error reaches a gRPC client as a status,
            # 400 -> INVALID_ARGUMENT with this message. REST requests keep their own 400s.
            first = batch.errors[0]
            more = f" (and {batch.size - 1} more bad requests in this batch)" if batch.size > 1 else ""
            self.tally(batch)
            raise PredictionException(status_phrase(str(first) + more), first.code)
        responses: list[Any] = [None] * batch.size
        for index, error in batch.errors.items():
            self.context.set_response_status(error.code, status_phrase(str(error)), index)
            responses[index] = self.refusal(error, batch.paths[index])
        start = 0
        for index, decoded in batch.decoded.items():
            outputs, start = batch.outputs[start : start + len(decoded.rows)], start + len(decoded.rows)
            try:
                responses[index] = self.reply(decoded, outputs, batch.paths[index])
            except InvalidInput as error:  # what only the outputs tell (a width not served)
                batch.errors[index] = error
                self.context.set_response_status(error.code, status_phrase(str(error)), index)
                responses[index] = self.refusal(error, batch.paths[index])
        self.tally(batch)
        for index in range(batch.size):
            self.context.set_response_content_type(index, JSON)
            if grpc[index]:  # a StreamPredictions answer is this one message
                self.context.set_response_header(index, STREAM_NEXT, "false")
        return responses

    def tally(self, batch: Batch) -> None:
        """The batch's requests counted by outcome: answered, or refused for their reasons."""
        for error in batch.errors.values():
            self.stages.answered(error.reason)
        if answered := batch.size - len(batch.errors):
            self.stages.answered(OK, answered)
