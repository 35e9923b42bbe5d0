"""TorchServe handler: a causal language model, many sequences at once, streamed (handlers/generation/).

torch-model-archiver --handler handlers/text_generation.py ...   (see model_store/build.py)

Served over TorchServe's asyncCommunication or continuousBatching (the `batching` setting): the
kit's worker (handlers/worker.py) reads the frontend in a thread, handing each request to
`accept` as it reaches the worker, while the engine (`serve`, on the worker's main thread)
answers it, token by token or whole; under continuousBatching the worker also learns of clients
that went away (`cancel`), and the engine waits after each step for the frontend's batch that
followed the step before (`after_step`). `initialize` makes the engine its backend's traits name
(`generation_engine`, handlers/backends): for eager and inductor, the model in its served dtype
(a reduced one judged against float32 first: the accuracy guard, handlers/generation/agreement.py)
on the kit's engine; for
openvino, the IR `make archive` exported and judged, on OpenVINO GenAI's pipeline. Either
sizes its KV cache for the plan's contexts (`max_sequences` of them unless memory holds fewer) of
`context_length` positions, shared by its sequences, and generates once through every path
before the first request.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from ts.utils.util import PredictionException

from handlers.backends import BACKENDS, Backend
from handlers.free_memory import give_back
from handlers.generation import agreement, answers, api, compiled, openvino_engine
from handlers.generation.cache import TORCH_DTYPES
from handlers.generation.chunking import StepTimes
from handlers.generation.defaults import model_defaults
from handlers.generation.engine import Engine, prompt_chunk
from handlers.generation.grammar import Grammars
from handlers.generation.lookup import AcceptanceLog
from handlers.generation.metrics import SUFFIX as METRICS_SUFFIX
from handlers.generation.metrics import EngineMetrics
from handlers.generation.metrics import writer as metrics_writer
from handlers.generation.openvino_engine import OpenVinoEngine, Pipeline
from handlers.generation.respond import Responder, answer_whole, refuse
from handlers.generation.sequences import QueueFull
from handlers.generation.settings import GenerationSettings, KvCache
from handlers.generation.tools import detect
from handlers.generation.warm_up import WarmUp
from handlers.generation.weights import served_form, weight_parts
from handlers.loaders import causal_lm_as_saved, load_model
from handlers.optimize import RecompileWatch, fx_graph_cache_counts, graphs_compiled
from handlers.payload import URL_PATH, InvalidInput, NotFound, over_grpc, request_decoded, request_json
from handlers.replies import Transport
from handlers.settings import Weights
from handlers.stages import OK
from handlers.streaming import StreamingHandler
from handlers.switches import WorkerDirs, planned_kv_contexts, planned_sequences, served_settings

log = logging.getLogger(__name__)
SERVICE_UNAVAILABLE = 503
OVERLOAD = "overload"  # a refusal's reason: the engine's queue is full


def decode_body(request: dict[str, Any], api_kind: api.Api) -> Any:
    """OpenAI's paths take JSON; the kit's takes a bare prompt too."""
    return request_decoded(request) if api_kind is api.Api.KIT else request_json(request)


class TextGenerationHandler(StreamingHandler):
    settings_class = GenerationSettings
    initialized = False
    replies: Transport | None = None  # the worker's, once it has loaded the model
    weight_bytes: dict[str, int] = {}  # the model's weights by part, where the kit holds them (torch_engine)
    step_times: StepTimes | None = None  # what chose the chunk, where the settings left it open (warm_up)
    whole_graphs_loaded = 0  # the compiled forward's, from the archive (torch_engine)

    def initialize(self, context) -> None:
        from transformers import AutoConfig, AutoTokenizer

        start = time.perf_counter()
        self.model_name = context.model_name
        model_dir = Path(context.system_properties["model_dir"])
        # The model file's settings, with what the preset serves over them (make tune's prompt lookup).
        section = (context.model_yaml_config or {}).get("handler")
        settings = GenerationSettings.served_over(section, served_settings(self.model_name))
        if (planned := planned_sequences()) is not None:
            # The plan's: the settings' max_sequences or the preset's model_sequences.
            settings = dataclasses.replace(settings, max_sequences=planned)
        self.settings = settings
        # The KV cache the sequences share, in contexts: the plan's (fewer when memory holds no
        # more), else one a sequence.
        self.kv_contexts = planned_kv_contexts() or settings.max_sequences
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
        eos, sampling = model_defaults(model_dir, config)
        self.engine = getattr(self, BACKENDS[settings.backend].generation_engine)(model_dir, eos)
        log.info("%s: what the load freed: %s", self.model_name, give_back())
        vocabulary = getattr(config, "vocab_size", None) or len(self.tokenizer)
        self.grammars = Grammars(self.tokenizer, vocabulary, eos, self.engine.dialect)
        self.limits = api.Limits(
            settings.context_length,
            settings.max_new_tokens,
            sampling,
            vocabulary=vocabulary,
            model=self.model_name,
            backend=settings.backend.value,
            unserved=self.engine.unserved,
            tools=detect(getattr(self.tokenizer, "chat_template", None), settings.tool_format),
        )
        load_seconds = time.perf_counter() - start
        graphs, (hits, _, _) = graphs_compiled(), fx_graph_cache_counts()
        warm_seconds = self.warm_up()
        if settings.backend is Backend.INDUCTOR and (
            kept := compiled.keep(model_dir, self.engine.model.forward, compiled.cache_dir())
        ):
            log.info("%s: %s", self.model_name, kept)
        log.info("%s: what the warm-up freed: %s", self.model_name, give_back())
        self.engine.metrics = EngineMetrics()  # the warm-up's sequences were no one's requests
        self.acceptance = AcceptanceLog()  # what prompt lookup kept, logged now and then
        if (stages := WorkerDirs.from_environment().stages) is not None:  # in a server: for its /metrics
            path = stages / f"{self.model_name}-{os.getpid()}{METRICS_SUFFIX}"
            metrics_writer(path, self.model_name, self.engine.metrics, self.engine.gauges).start()
        graphs, hits = graphs_compiled() - graphs, fx_graph_cache_counts()[0] - hits
        log.info(
            "%s ready: backend=%s dtype=%s sequences=%d context=%d kv_cache=%d contexts in %s (%.0fMB, resident as used) "
            "prefill_chunk=%d%s prefix_caching=%s%s prompt_lookup=%d weights=%s%s eos=%s load=%.1fs warmup=%.1fs "
            "graphs=%d (%d loaded whole, %d from the compile cache)",
            self.model_name,
            settings.backend.value,
            settings.dtype.value,
            settings.max_sequences,
            settings.context_length,
            self.kv_contexts,
            KvCache.INT8.value if settings.kv_cache is KvCache.INT8 else settings.dtype.value,
            self.engine.cache_bytes / 1e6,
            self.engine.prefill_chunk,
            "" if self.step_times is None else f" ({self.step_times})",
            "on" if self.engine.prefix_caching else "off",
            f" (a store of {self.engine.store_blocks * self.engine.block_bytes / 1e6:.0f}MB)"
            if self.engine.store_blocks
            else "",
            self.engine.lookup,
            settings.weights.value,
            "".join(f" ({part} {size / 1e6:.0f}MB)" for part, size in self.weight_bytes.items()),
            sorted(eos),
            load_seconds,
            warm_seconds,
            graphs + self.whole_graphs_loaded,
            self.whole_graphs_loaded,
            hits,
        )
        self.initialized = True

    def torch_engine(self, model_dir: Path, eos: set[int]) -> Engine:
        """The model in its served dtype (a reduced one judged against float32 first), eager or
        compiled, on the kit's engine."""
        settings = self.settings
        guard = agreement.limits(settings)
        reference = None if guard is None else self.shipped_reference(model_dir)
        if guard is not None and reference is None:
            model = load_model(settings, model_dir)  # float32, whatever the checkpoint's dtype
            reference = self.float_reference(model, model_dir)
        else:
            # Nothing needs the float model: converted below a tensor at a time. A bf16 checkpoint
            # served in float32, read as float32 by transformers, peaked at 3.15 GiB (Qwen2.5-0.5B's
            # shape; docs/generation.md, "Memory of a load").
            model = causal_lm_as_saved(model_dir)
        for said in served_form(model, model_dir, TORCH_DTYPES[settings.dtype], int8=settings.weights is Weights.INT8):
            log.info("%s: %s", self.model_name, said)
        self.weight_bytes = weight_parts(model)
        if reference is not None:
            # Judged as it will serve (packed or quantized), before the compiler: it computes the same.
            agreed = agreement.measure(model, reference, settings.kv_cache)
            log.info(
                "%s accuracy against float32: %s (served in %s)", self.model_name, agreed.summary(), settings.precision
            )
            agreement.require(agreed, guard, settings.precision)
        if settings.backend is Backend.INDUCTOR:
            log.info("%s: %s", self.model_name, compiled.unpack(model_dir, compiled.cache_dir()))
            model.forward, said = compiled.compile_forward(model, model_dir)
            self.whole_graphs_loaded = len(model.forward.loaded_kinds)  # traced by no one: not among Dynamo's graphs
            log.info("%s: %s", self.model_name, said)
        return Engine(
            model,
            self.decode,
            eos,
            settings.max_sequences,
            settings.context_length,
            TORCH_DTYPES[settings.dtype],
            settings.max_waiting,
            self.model_name,
            settings.itt,
            settings.prefill_chunk or 0,  # null: measured after the warm-up (warm_up)
            prefix_caching=settings.prefix_caching,
            lookup=settings.prompt_lookup,
            kv_positions=self.kv_contexts * settings.context_length,
            kv_int8=settings.kv_cache is KvCache.INT8,
            prefix_store_bytes=settings.prefix_store_mb * 10**6,
        )

    def openvino_engine(self, model_dir: Path, eos: set[int]) -> OpenVinoEngine:
        """The archive's IR (exported and judged by `make archive`) on OpenVINO GenAI's pipeline."""
        settings = self.settings
        pipeline = Pipeline.load(
            model_dir / openvino_engine.DIRECTORY,
            settings.dtype,
            settings.max_sequences,
            settings.context_length,
            prompt_chunk(openvino_engine.PIPELINE_CHUNK if settings.prefill_chunk is None else settings.prefill_chunk),
            torch.get_num_threads(),  # the launcher's
            self.kv_contexts,
            settings.kv_cache,
        )
        return OpenVinoEngine(
            pipeline,
            self.decode,
            eos,
            settings.max_sequences,
            settings.context_length,
            settings.max_waiting,
            self.model_name,
            settings.itt,
        )

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def shipped_reference(self, model_dir: Path) -> agreement.Reference | None:
        """The float model's answers on the held-out prompts (agreement.held_out_prompts) that
        `make archive` made, if it made them for these prompts."""
        prompts = agreement.held_out_prompts(model_dir, self.settings, self.tokenize)
        tokens = agreement.judged_tokens(self.settings)
        if (reference := agreement.Reference.shipped(model_dir, prompts, tokens)) is not None:
            self.log_reference(len(prompts), tokens, "read from the archive")
        return reference

    def float_reference(self, model, model_dir: Path) -> agreement.Reference:
        """The float model's answers on the held-out prompts, now (an archive without them)."""
        start = time.perf_counter()
        prompts = agreement.held_out_prompts(model_dir, self.settings, self.tokenize)
        tokens = agreement.judged_tokens(self.settings)
        reference = agreement.Reference.of(model, prompts, tokens)
        shipped = (model_dir / agreement.REFERENCE_FILE).is_file()
        how = "answered by the float model" + (" (the archive's were made for other prompts)" if shipped else "")
        self.log_reference(len(prompts), tokens, f"{how} in {time.perf_counter() - start:.1f}s")
        return reference

    def log_reference(self, prompts: int, tokens: int, how: str) -> None:
        log.info(
            "%s: the float model's answers on %d held-out prompts (%d tokens each) %s",
            self.model_name,
            prompts,
            tokens,
            how,
        )

    def warm_up(self) -> float:
        """Every kind of step a request takes, compiled before the first (warm_up.py); the prefill
        chunk timed where the settings leave it open."""
        start = time.perf_counter()
        self.step_times = WarmUp(self.engine, self.tokenizer, self.settings).run()
        if self.step_times is not None:
            self.engine.prefill_chunk = prompt_chunk(self.step_times.chunk())
        self.recompiles = RecompileWatch(self.model_name)
        return time.perf_counter() - start

    def serve(self) -> None:
        """The engine's loop on the calling thread, the one that warmed it up (handlers/worker.py),
        until stop()."""
        self.engine.run_forever(self.after_step)

    def stop(self) -> None:
        self.engine.stop()

    def after_step(self) -> None:
        self.recompiles.check()
        metrics = self.engine.metrics
        if line := self.acceptance.line(time.monotonic(), metrics.draft_tokens, metrics.accepted_tokens):
            log.info("%s: %s", self.model_name, line)
        if self.replies is not None:
            self.replies.settle()

    # -- TorchServe ---------------------------------------------------------------------------
    def handle(self, data, context):
        raise PredictionException(
            "text generation is served by the kit's worker with asyncCommunication or continuousBatching "
            "(model-config.yaml), not a batch at a time",
            500,
        )

    def connect(self, replies: Transport) -> None:
        """Where the answers go: the worker's, before its first request."""
        self.replies = replies

    def accept(self, request_id: str, request: dict[str, Any], headers: dict[str, Any]) -> None:
        """One request, as it arrives (the worker's reader thread): checked, then queued; counted
        by its outcome (the metrics port's kit_requests_total)."""
        self.engine.metrics.answered(self.take(request_id, request, headers))

    def take(self, request_id: str, request: dict[str, Any], headers: dict[str, Any]) -> str:
        """Queue or answer the request, else refuse it; OK or the refusal's reason."""
        replies, grpc = self.replies, over_grpc(headers)
        path = str(headers.get(URL_PATH) or "").strip("/")
        try:
            kind = api.Api(path)
        except ValueError:
            paths = ", ".join(f"'{a.value}'" for a in api.Api)
            refuse(replies, request_id, api.Api.KIT, f"unknown path {path!r}; this model serves {paths}", 404, grpc)
            return NotFound.reason
        if kind is api.Api.MODELS:
            answer_whole(replies, request_id, answers.model_list(self.model_name, self.limits.context), grpc)
            return OK
        try:
            parsed = api.parse(
                kind, decode_body(request, kind), self.limits, self.tokenize, self.apply_template, self.grammars
            )
        except InvalidInput as error:
            refuse(replies, request_id, kind, str(error), error.code, grpc)
            return error.reason
        answer = answers.ANSWERS[kind](request_id, self.model_name, parsed)
        responder = Responder(replies, request_id, answer, parsed.stream, grpc, parsed.n)
        asked = [(generation, responder.choice(i)) for i, generation in enumerate(parsed.generations())]
        try:
            self.engine.submit_all(asked, key=request_id)
        except QueueFull as error:
            refuse(replies, request_id, kind, str(error), SERVICE_UNAVAILABLE, grpc)
            return OVERLOAD
        responder.open()
        return OK

    def cancel(self, request_id: str) -> None:
        """The request's client went away: its sequence ends at the engine's next step (logged)."""
        self.engine.cancel(request_id)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    @property
    def apply_template(self):
        if not getattr(self.tokenizer, "chat_template", None):
            return None
        return self._apply_template

    def _apply_template(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, opening: str
    ) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        except Exception as error:  # noqa: BLE001 - a template's own checks (roles, order) raise anything
            raise InvalidInput(f"the model's chat template refused the messages: {error}") from None
        # The template writes the special tokens (BOS) it wants; `opening`, what the answer opens with.
        return list(self.tokenizer(text + opening, add_special_tokens=False)["input_ids"])
