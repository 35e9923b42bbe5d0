"""A language model's handler settings (the `handler:` section of its model-config.yaml), parsed
once like every task's (handlers/settings.py).

    settings = parse_settings(GenerationSettings, context.model_yaml_config.get("handler", {}))
    GenerationSettings.served_over(section, {"prompt_lookup": 4})   # a preset's over the archive's
"""

from __future__ import annotations

import dataclasses
import enum
import typing

from handlers.backends import BACKENDS
from handlers.generation.tools import Syntax
from handlers.settings import Architecture, OptimizationSettings, Weights
from handlers.typed_config import SettingsError, parse_settings

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


class KvCache(enum.StrEnum):
    """What the KV cache holds keys and values in (handlers/generation/cache.py)."""

    DTYPE = "dtype"  # the served dtype
    # A byte an element and a float32 scale per head and position: (head + 4) / (4 x head) of
    # float32's bytes (27 % at a head of 64), judged against float32 before serving as a reduced
    # dtype is. On OpenVINO's pipeline, its CPU plugin's u8 cache (a scale and a zero point).
    INT8 = "int8"


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
        {"prompt_lookup", "prefill_chunk", "prefix_caching", "prefix_store_mb", "max_waiting", "max_new_tokens"}
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
    # not by all of them. 128 kept 16 streams' inter-token p99 within 4x its median on 2 cores
    # (256: 5.6-8x) for as many tokens a second (docs/generation.md, "Chunks of 128"). 0: each
    # prompt whole as it is admitted. null: the most that keep such a step within 3 decode steps,
    # timed at warm-up (handlers/generation/chunking.py; OpenVINO's pipeline: 256): a shorter
    # inter-token tail for fewer tokens a second on a small machine.
    prefill_chunk: int | None = 128
    # A prompt that begins with blocks of tokens another request left in the cache (a shared
    # system prompt, a conversation's earlier turns) computes only the rest (prefix caching).
    prefix_caching: bool = True
    # Blocks a row held when another sequence takes it, kept beside the rows up to this many MB
    # (within the KV cache's budget, given up first when a sequence needs room): a server with
    # more conversations than max_sequences finds their earlier turns (prefix_store.py). 0: off,
    # what the rows hold alone: memory at many streams stays what the streams write (a store of a
    # quarter of the KV budget, full of unrelated prompts at 16 streams, held 0.9 GB of a
    # Qwen3-0.6B-shaped bf16 worker's 3.3: docs/generation.md, "The prefix store").
    prefix_store_mb: int = 0
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
    # What the KV cache holds keys and values in (KvCache): `int8` fits 3.8x the positions of a
    # float32 cache in the same memory at a head of 64 (1.9x bfloat16's), read back at every step.
    kv_cache: KvCache = KvCache.DTYPE

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
        for name in ("max_waiting", "prefill_chunk", "prompt_lookup", "prefix_store_mb"):
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
        precision = (
            self.dtype.value if self.weights is Weights.DTYPE else f"{self.dtype.value} on {self.weights.value} weights"
        )
        return precision + (" with an int8 KV cache" if self.kv_cache is KvCache.INT8 else "")

    def torchserve_keys(self) -> dict[str, typing.Any]:
        if self.batching is Batching.ASYNC:
            return {"asyncCommunication": True, "continuousBatching": False}
        return {
            "continuousBatching": True,
            "asyncCommunication": False,
            "batchSize": CONTINUOUS_BATCH_SIZE,
            "maxBatchDelay": CONTINUOUS_BATCH_DELAY_MS,
        }
