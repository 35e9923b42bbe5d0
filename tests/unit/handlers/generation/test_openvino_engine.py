"""handlers/generation/openvino_engine.py with the pipeline's place taken by a script: what the
kit decides for each token the pipeline gives (end of sequence, stop strings, lengths, cancel),
what it asks the pipeline for, and a request's sampling as the pipeline's GenerationConfig. The
pipeline itself serves in tests/e2e/generation/ (the openvino variant, token for token
equal to transformers)."""

from __future__ import annotations

import os

import openvino_genai
import pytest

from handlers.backends import DType
from handlers.generation.grammar import Dialect, Grammars
from handlers.generation.openvino_engine import (
    SEED_BITS,
    OpenVinoEngine,
    Pipeline,
    one_thread_below_amx,
    precision_properties,
)
from handlers.generation.sampling import Sampling
from handlers.generation.sequences import Finish, Generation, QueueFull, Usage
from handlers.generation.settings import KvCache
from tests.unit.handlers.generation.engines import Recorder

RUNNING, FINISHED, IGNORED = (
    openvino_genai.GenerationStatus.RUNNING,
    openvino_genai.GenerationStatus.FINISHED,
    openvino_genai.GenerationStatus.IGNORED,
)
EOS = 2


class Output:
    def __init__(self, ids: list[int]):
        self.generated_ids = ids


class Handle:
    """A request in the scripted pipeline: `script` is the token ids each step gives it."""

    def __init__(self, script: list[list[int]], max_new_tokens: int, drop_after: int | None = None):
        self.script, self.max_new_tokens, self.drop_after = script, max_new_tokens, drop_after
        self.steps, self.given, self.unread, self.cancelled = 0, 0, [], False

    def advance(self) -> None:
        if self.get_status() is not RUNNING:
            return
        ids = self.script[self.steps] if self.steps < len(self.script) else [7]
        self.steps += 1
        ids = ids[: self.max_new_tokens - self.given]
        self.given += len(ids)
        self.unread += ids

    def can_read(self) -> bool:
        return bool(self.unread)

    def read(self) -> dict[int, Output]:
        ids, self.unread = self.unread, []
        return {0: Output(ids)}

    def get_status(self):
        if self.cancelled:
            return openvino_genai.GenerationStatus.CANCEL
        if self.drop_after is not None and self.steps >= self.drop_after:
            return IGNORED
        return FINISHED if self.given >= self.max_new_tokens else RUNNING

    def cancel(self) -> None:
        self.cancelled = True


class Scripted:
    """Pipeline's place: each request's handle follows the next script given."""

    def __init__(self, *scripts: list[list[int]], drop_after: int | None = None):
        self.scripts, self.drop_after = list(scripts), drop_after
        self.handles: list[Handle] = []
        self.asked: list[tuple[int, tuple[int, ...], int, Sampling, str]] = []
        self.steps = 0

    def add(self, request_id: int, prompt, max_new_tokens: int, sampling: Sampling, grammar: str = "") -> Handle:
        self.asked.append((request_id, tuple(prompt), max_new_tokens, sampling, grammar))
        handle = Handle(self.scripts.pop(0) if self.scripts else [], max_new_tokens, self.drop_after)
        self.handles.append(handle)
        return handle

    def step(self) -> None:
        self.steps += 1
        for handle in self.handles:
            handle.advance()

    cache_bytes = 4096


def decode(ids) -> str:
    return "".join(f"<{i}>" for i in ids)


def engine(pipeline: Scripted, slots: int = 2, context: int = 64, waiting: int = 4) -> OpenVinoEngine:
    return OpenVinoEngine(pipeline, decode, {EOS}, slots, context, waiting, "lm")


def finish(engine_: OpenVinoEngine) -> None:
    for _ in range(1000):
        if not engine_.busy:
            return
        engine_.step()
    raise AssertionError("the engine did not finish")


def test_each_token_the_pipeline_gives_is_streamed_and_its_end_of_sequence_ends_it_and_frees_the_pipelines_request():
    pipeline = Scripted([[5], [6, 9], [EOS], [8]])
    recorder = Recorder()
    e = engine(pipeline)
    e.submit(Generation((1, 2, 3), 10), recorder)
    finish(e)
    assert "".join(recorder.parts) == "<5><6><9>"
    assert recorder.reason is Finish.STOP and recorder.usage == Usage(3, 3)  # the end-of-sequence token is not counted
    assert pipeline.handles[0].cancelled  # its blocks are the next request's
    assert pipeline.asked[0][1:3] == ((1, 2, 3), 10)


def test_ignore_eos_takes_the_end_of_sequence_token_as_any_other_until_max_new_tokens():
    pipeline = Scripted([[EOS], [EOS], [5]])
    recorder = Recorder()
    e = engine(pipeline)
    e.submit(Generation((1,), 3, ignore_eos=True), recorder)
    finish(e)
    assert recorder.reason is Finish.LENGTH and recorder.usage == Usage(1, 3)


def test_a_stop_string_ends_the_sequence_within_one_read_of_several_tokens():
    pipeline = Scripted([[5, 6, 7, 8]])
    recorder = Recorder()
    e = engine(pipeline)
    e.submit(Generation((1,), 10, stop=("<6>",)), recorder)
    finish(e)
    assert "".join(recorder.parts) == "<5>" and recorder.reason is Finish.STOP
    assert recorder.usage == Usage(1, 2)  # the tokens after the stop string in the same read are not taken


def test_the_pipeline_is_asked_for_at_most_one_token_past_the_positions_the_context_leaves():
    """As the kit's engine: the token whose position is the context's ends the sequence (never fed)."""
    pipeline = Scripted()
    recorder = Recorder()
    e = engine(pipeline, context=16)
    e.submit(Generation(tuple(range(10)), 100, ignore_eos=True), recorder)
    finish(e)
    assert pipeline.asked[0][2] == 16 - 10 + 1
    assert recorder.reason is Finish.LENGTH and recorder.usage == Usage(10, 7)


def test_a_sequence_the_pipeline_drops_ends_cancelled_and_the_engine_serves_on():
    pipeline = Scripted([[5], [6]], drop_after=1)
    dropped, next_one = Recorder(), Recorder()
    e = engine(pipeline)
    e.submit(Generation((1,), 10), dropped)
    finish(e)
    assert dropped.reason is Finish.CANCELLED and dropped.usage == Usage(1, 1)
    pipeline.drop_after = None
    e.submit(Generation((1,), 2, ignore_eos=True), next_one)
    finish(e)
    assert next_one.reason is Finish.LENGTH


def test_slots_admit_in_order_a_full_queue_refuses_and_a_cancel_frees_a_slot_at_the_next_step():
    pipeline = Scripted()
    e = engine(pipeline, slots=2, waiting=1)
    recorders = [Recorder() for _ in range(3)]
    e.submit(Generation((1,), 100, ignore_eos=True), recorders[0], key="a")
    e.step()
    e.submit(Generation((2,), 100, ignore_eos=True), recorders[1], key="b")
    e.step()
    e.submit(Generation((3,), 2, ignore_eos=True), recorders[2], key="c")
    e.step()
    assert [asked[1] for asked in pipeline.asked] == [(1,), (2,)]  # "c" waits for a slot
    with pytest.raises(QueueFull, match="2 sequences are generating and 1 requests wait"):
        e.submit(Generation((4,), 2), Recorder())
    assert e.cancel("a")
    e.step()
    assert recorders[0].reason is Finish.CANCELLED and pipeline.handles[0].cancelled
    assert [asked[1] for asked in pipeline.asked] == [(1,), (2,), (3,)]
    assert e.cancel("b")
    finish(e)
    assert recorders[2].reason is Finish.LENGTH and recorders[2].usage == Usage(1, 2)
    assert not e.cancel("a")  # ended: nothing to cancel


class Recording:
    """ContinuousBatchingPipeline's place: the GenerationConfig each request was added with."""

    def __init__(self):
        self.configs = []

    def add_request(self, request_id, ids, config):
        self.configs.append((ids.shape, config))
        return None


@pytest.mark.parametrize(
    ("sampling", "expected"),
    [
        (Sampling(), {"do_sample": False}),
        (Sampling(temperature=0.7, top_p=0.9, top_k=40, seed=11), {"do_sample": True, "rng_seed": 11, "top_k": 40}),
        (Sampling(temperature=1.5), {"do_sample": True}),
        (Sampling(repetition_penalty=1.1), {"do_sample": False}),  # the model's default: not dropped
    ],
)
def test_a_requests_sampling_is_the_pipelines_generation_config(sampling, expected):
    recording = Recording()
    Pipeline(recording).add(3, [4, 5, 6], 12, sampling)
    shape, config = recording.configs[0]
    assert list(shape) == [1, 3]
    assert config.max_new_tokens == 12 and config.ignore_eos  # the kit's end-of-sequence ids end it
    for name, value in expected.items():
        assert getattr(config, name) == value
    assert config.repetition_penalty == pytest.approx(sampling.repetition_penalty)
    if not sampling.greedy:
        assert config.temperature == pytest.approx(sampling.temperature)
        assert config.top_p == pytest.approx(sampling.top_p)
        assert 0 <= config.rng_seed < 2**SEED_BITS


def test_unseeded_requests_draw_seeds_of_their_own():
    recording = Recording()
    for _ in range(4):
        Pipeline(recording).add(0, [1], 4, Sampling(temperature=1.0))
    assert len({config.rng_seed for _, config in recording.configs}) == 4


def test_with_itt_each_pipeline_step_is_one_range_named_by_the_sequences_it_advances(monkeypatch):
    from tests.unit.handlers.serving import RangeRecorder

    recorder = RangeRecorder()
    recorder.install(monkeypatch)
    pipeline = Scripted()
    e = OpenVinoEngine(pipeline, decode, {EOS}, 2, 64, 4, "lm", itt=True)
    e.submit(Generation((1,), 2, ignore_eos=True), Recorder())
    e.submit(Generation((2,), 1, ignore_eos=True), Recorder())
    finish(e)
    assert recorder.events == ["push lm:bs2", "pop", "push lm:bs1", "pop"]
    assert pipeline.steps == 2


def test_a_requests_grammar_is_the_pipelines_structured_output_and_none_is_none():
    recording = Recording()
    grammar = 'root ::= "true" | "false"'
    Pipeline(recording).add(1, [4], 8, Sampling(), grammar)
    Pipeline(recording).add(2, [4], 8, Sampling())
    (_, constrained), (_, free) = recording.configs
    assert constrained.structured_output_config.grammar == grammar
    assert free.structured_output_config is None


def test_a_constrained_request_reaches_the_pipeline_with_its_grammar_and_no_matcher():
    grammars = Grammars(None, 16, {EOS}, Dialect.EBNF)  # EBNF needs no tokenizer of the kit's
    constraint = grammars.parse({"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "boolean"}}})
    pipeline = Scripted([[EOS]])
    e = OpenVinoEngine(pipeline, decode, {EOS}, slots=1, context=32)
    running = e.submit(Generation((1, 2), 8, constraint=constraint), Recorder())
    assert running.matcher is None  # the pipeline follows the grammar, not the kit's masks
    finish(e)
    assert pipeline.asked[0][4].startswith("root ::= json_boolean\n")


@pytest.mark.parametrize(
    ("dtype", "kv_cache", "expected"),
    [
        (DType.FLOAT32, KvCache.DTYPE, {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}),
        (DType.BFLOAT16, KvCache.DTYPE, {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "bf16"}),
        (DType.FLOAT32, KvCache.INT8, {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "u8"}),
        (DType.BFLOAT16, KvCache.INT8, {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "u8"}),
    ],
)
def test_the_cpu_plugin_computes_in_the_served_dtype_and_caches_as_the_settings_say(dtype, kv_cache, expected):
    # Always both: the plugin's own default cache on CPU is u8, whatever the served dtype.
    assert precision_properties(dtype, kv_cache) == expected


@pytest.mark.parametrize(
    ("dtype", "threads", "flags", "below"),
    [
        (DType.BFLOAT16, 1, {"avx512_bf16", "amx_bf16"}, True),  # SIGFPE in the CPU plugin otherwise
        (DType.BFLOAT16, 2, {"avx512_bf16", "amx_bf16"}, False),
        (DType.FLOAT32, 1, {"avx512_bf16", "amx_bf16"}, False),
        (DType.BFLOAT16, 1, {"avx512_bf16"}, False),
    ],
)
def test_bf16_on_one_thread_keeps_onednn_below_amx_and_nothing_else_does(monkeypatch, dtype, threads, flags, below):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert one_thread_below_amx(dtype, threads, frozenset(flags)) is below
    assert os.environ.get("ONEDNN_MAX_CPU_ISA") == ("AVX512_CORE_BF16" if below else None)
