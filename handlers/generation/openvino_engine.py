"""Continuous batching by OpenVINO GenAI's pipeline: a language model's openvino variants.

    engine = OpenVinoEngine(Pipeline.load(ir_dir, dtype, slots, context, chunk, threads, kv_contexts=slots),
                            decode, eos, slots, context)
    engine.submit(Generation(prompt_ids, 64), sink, key="r1")     # as engine.Engine
    engine.run_forever()

The IR is the archive's (model_store/openvino_lm.py exports it at `make archive`). The pipeline
(ContinuousBatchingPipeline, what OpenVINO Model Server runs) computes each step over every
sequence it holds, with paged attention over a KV cache allocated once and its own chunked
prefill; the kit keeps everything a request sees the same as on its own engine (Scheduler):
the prompt is the kit's tokens, admission and the queue's limit, end-of-sequence, stop strings,
lengths and cancel are the kit's, each token as it comes. The pipeline samples (its greedy is an
argmax, as the kit's; its draws are its own, seeded by the request's seed).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import types
from collections.abc import Callable, Sequence
from pathlib import Path

from handlers.backends import DType, cpu_flags
from handlers.generation.file_pages import FilePages
from handlers.generation.grammar import Dialect
from handlers.generation.sampling import Sampling
from handlers.generation.scheduler import Running, Scheduler
from handlers.generation.sequences import Finish
from handlers.generation.settings import KvCache
from handlers.itt import inference_range

log = logging.getLogger(__name__)
# The CPU plugin's inference precision, and the KV cache's: the served dtype, or u8 where the
# settings ask for an int8 cache. Its default cache precision on CPU is u8, a reduction the accuracy
# guard would not see in the served dtype's name: always set.
PRECISIONS = {DType.FLOAT32: "f32", DType.BFLOAT16: "bf16"}
KV_INT8 = "u8"
# Bytes its u8 cache keeps beside each head's vector at a position: a float32 scale and zero point
# (read back from the pipeline: 40 bytes a head of 32, against 128 in f32).
KV_INT8_SIDE = 8
# Positions per block of the CPU plugin's paged KV cache (measured: 10 blocks hold 320 tokens);
# the cache is sized in blocks. Were it other, the log's cache size (read back) says so.
BLOCK = 32
# The pipeline's prompt tokens a step where the settings leave the chunk open (`prefill_chunk:
# null`): OpenVINO GenAI's own default; it times no steps of its own to choose one.
PIPELINE_CHUNK = 256
SEED_BITS = 63  # an unseeded request's draw: a seed of its own
MODEL = "openvino_model.xml"  # in the IR directory, beside the tokenizer's models
WEIGHTS = "openvino_model.bin"  # the IR's weights, beside MODEL
DIRECTORY = "openvino"  # the IR's directory in an archive's model directory


def precision_properties(dtype: DType, kv_cache: KvCache = KvCache.DTYPE) -> dict[str, str]:
    """The CPU plugin's properties that compute in `dtype` and cache as `kv_cache` says: the
    pipeline's and the guard's alike."""
    precision = PRECISIONS[dtype]
    return {
        "INFERENCE_PRECISION_HINT": precision,
        "KV_CACHE_PRECISION": KV_INT8 if kv_cache is KvCache.INT8 else precision,
    }


# oneDNN as OpenVINO 2026.4.1 bundles it divides by zero computing bf16 on AMX with one thread:
# the process dies of SIGFPE in libopenvino_intel_cpu_plugin at its first inference (the pipeline
# and the plain model alike; 2-core Intel Xeon KVM VM with AMX, a worker given one CPU by the e2e
# tests at f74d1c7). Kept below AMX it computes; with two threads AMX computes too.
BELOW_AMX = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}


def one_thread_below_amx(dtype: DType, threads: int, flags: frozenset[str] | None = None) -> bool:
    """Keep oneDNN below AMX where bf16 would be computed on it with one thread (before the first
    compile: oneDNN reads the setting once); whether it was."""
    if dtype is not DType.BFLOAT16 or threads != 1 or "amx_bf16" not in (cpu_flags() if flags is None else flags):
        return False
    for name, value in BELOW_AMX.items():
        os.environ.setdefault(name, value)
    return True


@dataclasses.dataclass
class Pipeline:
    """The pipeline, and what a request needs from it."""

    pipeline: object  # openvino_genai.ContinuousBatchingPipeline

    @classmethod
    def load(
        cls,
        ir_dir: Path,
        dtype: DType,
        slots: int,
        context: int,
        chunk: int,
        threads: int,
        kv_contexts: int,
        kv_cache: KvCache = KvCache.DTYPE,
    ) -> Pipeline:
        """`slots` sequences of `context` tokens at most, sharing a KV cache of `kv_contexts`
        contexts held as `kv_cache` says (the pipeline preempts a sequence when its blocks run
        out); `chunk` prompt tokens a step at most (0: each prompt whole as it is admitted)."""
        import openvino_genai

        scheduler = openvino_genai.SchedulerConfig()
        scheduler.max_num_seqs = slots
        scheduler.num_kv_blocks = kv_contexts * math.ceil(context / BLOCK)
        scheduler.dynamic_split_fuse = bool(chunk)
        # Off whatever the settings say: with it on, OpenVINO GenAI 2026.4 answered a prompt that
        # arrived beside an identical one with wrong tokens (tests/e2e/generation/'s requests
        # generated together failed in 3 of 6 runs and once in CI, in none of 9 with it off).
        scheduler.enable_prefix_caching = False
        # A step's tokens: a chunk, and a decode row per sequence; whole, a prompt the context holds.
        scheduler.max_num_batched_tokens = (chunk + slots) if chunk else context * slots
        threading = {"INFERENCE_NUM_THREADS": threads}  # the launcher's, as torch's
        one_thread_below_amx(dtype, threads)
        properties = {**precision_properties(dtype, kv_cache), **threading}
        pipeline = openvino_genai.ContinuousBatchingPipeline(str(ir_dir), scheduler, "CPU", properties)
        # The plugin compiled copies of the IR's weights in its own precision and layout, reading
        # them through a mapping whose pages would stay resident beside the copies (Qwen2.5-0.5B's
        # float16 IR: 938 MiB, of 2.2 GiB after a first step). What it reads again (an embedding's
        # rows) comes back from the file as used: 345 MiB after 4 prompts of random tokens.
        released = FilePages().release_file(ir_dir / WEIGHTS)
        log.info("the IR's weights, compiled, let go of %d MB of their file's pages", released // 10**6)
        return cls(pipeline)

    def add(self, request_id: int, prompt: Sequence[int], max_new_tokens: int, sampling: Sampling, grammar: str = ""):
        """A sequence into the pipeline; `grammar` (EBNF, grammar.py) constrains its answer."""
        import numpy as np
        import openvino as ov
        import openvino_genai

        config = openvino_genai.GenerationConfig()
        config.max_new_tokens = max_new_tokens
        config.ignore_eos = True  # the kit's end-of-sequence ids end a sequence (Scheduler._accept)
        config.do_sample = not sampling.greedy
        # Only the model's default (generation_config.json) reaches here, a request's own being
        # refused (unserved): the pipeline's penalty, over the prompt and the answer as transformers'.
        config.repetition_penalty = sampling.repetition_penalty
        if not sampling.greedy:
            config.temperature, config.top_p = sampling.temperature, sampling.top_p
            if sampling.top_k:
                config.top_k = sampling.top_k
            config.rng_seed = sampling.seed if sampling.seed is not None else random.getrandbits(SEED_BITS)
        if grammar:
            structured = openvino_genai.StructuredOutputConfig()
            structured.grammar = grammar
            config.structured_output_config = structured
        ids = ov.Tensor(np.array([list(prompt)], dtype=np.int64))
        return self.pipeline.add_request(request_id, ids, config)

    def step(self) -> None:
        self.pipeline.step()

    @property
    def cache_bytes(self) -> int:
        return int(self.pipeline.get_metrics().kv_cache_size_in_bytes)


@dataclasses.dataclass
class Forward:
    """The exported model itself (its KV cache as state), for the accuracy guard: transformers'
    call shape, logits at every position of one sequence, in the served precision."""

    request: object  # an openvino InferRequest

    @classmethod
    def load(cls, ir_dir: Path, dtype: DType, kv_cache: KvCache = KvCache.DTYPE) -> Forward:
        import openvino as ov

        one_thread_below_amx(dtype, len(os.sched_getaffinity(0)))  # the plugin's threads: every CPU it may use
        compiled = ov.Core().compile_model(str(ir_dir / MODEL), "CPU", precision_properties(dtype, kv_cache))
        return cls(compiled.create_infer_request())

    def __call__(self, input_ids, attention_mask=None, **_):
        import numpy as np
        import torch

        ids = input_ids.numpy()
        self.request.reset_state()  # a sequence of its own, from its first position
        inputs = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "position_ids": np.arange(ids.shape[1])[None].repeat(ids.shape[0], 0),
            "beam_idx": np.arange(ids.shape[0], dtype=np.int32),
        }
        logits = self.request.infer(inputs)["logits"]
        return types.SimpleNamespace(logits=torch.from_numpy(np.array(logits)))


class OpenVinoEngine(Scheduler):
    """Steps computed by OpenVINO GenAI's pipeline; a request's tokens read from its handle after each."""

    prefill_chunk = 0  # the pipeline chunks prompts itself
    prefix_caching = False  # (Pipeline.load)
    store_blocks = 0  # nor the kit's prefix store
    # The pipeline has no logit bias and no alternatives' log-probabilities, and its penalties are
    # not checked to equal the kit's (sampling.py): refused by name rather than answered otherwise.
    unserved = frozenset(
        {"logit_bias", "repetition_penalty", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs"}
    )
    dialect = Dialect.EBNF  # response_format and a forced tool_choice: the pipeline's structured output
    mixes = False  # (the warm-up's mixed steps are the kit's engine's)

    def __init__(
        self,
        pipeline: Pipeline,
        decode: Callable[[Sequence[int]], str],
        eos: set[int],
        slots: int,
        context: int,
        max_waiting: int = 64,
        name: str = "",
        itt: bool = False,
    ):
        super().__init__(decode, eos, slots, context, max_waiting, name)
        self.pipeline = pipeline
        self.itt = itt  # one ITT range per step (the pipeline's forward), as the kit's engine has per forward
        self.handles: dict[int, object] = {}  # by slot: the pipeline's handle of its sequence
        self.requests = 0

    @property
    def cache_bytes(self) -> int:
        return self.pipeline.cache_bytes

    def step(self) -> None:
        import openvino_genai

        for sequence in self._admit():
            generation = sequence.generation
            # The kit's engine ends a sequence at the token whose position is the context's
            # (it is never fed): room for one more than the positions left.
            room = self.context - len(generation.prompt) + 1
            self.handles[sequence.slot] = self.pipeline.add(
                self.requests,
                generation.prompt,
                min(generation.max_new_tokens, room),
                generation.sampling,
                generation.constraint.grammar if generation.constraint else "",
            )
            self.requests += 1
        if not self.active:
            return
        with inference_range(self.name, len(self.active), self.itt):
            self.pipeline.step()
        for slot, sequence in list(self.active.items()):
            handle = self.handles[slot]
            if handle.can_read():
                for output in handle.read().values():
                    for token in output.generated_ids:
                        if sequence.slot < 0:
                            break  # ended by an earlier token of this read
                        self._accept(sequence, int(token))
            status = handle.get_status()
            if sequence.slot >= 0 and status != openvino_genai.GenerationStatus.RUNNING:
                # At its last token the kit has ended it (_accept); else the pipeline dropped it.
                log.warning("%s: the pipeline ended a sequence before the kit did (%s)", self.name, status)
                self._end(sequence, Finish.CANCELLED)

    def _end(self, sequence: Running, reason: Finish) -> None:
        handle = self.handles.pop(sequence.slot, None)
        if handle is not None:
            handle.cancel()  # its blocks free for the next step
        super()._end(sequence, reason)
        sequence.slot = -1
