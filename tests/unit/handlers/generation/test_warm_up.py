"""handlers/generation/warm_up.py on a real engine: where a first step compiles, every kind of step
a request takes is computed at every size (decode rows alone, a prompt mixed with decode rows, a
part that starts past its prompt's first block); where none does, one prompt computes each kind
once; the engine is idle after it, and the step times are measured only where the chunk is open."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from handlers.generation.chunking import StepTimes
from handlers.generation.engine import Engine
from handlers.generation.settings import GenerationSettings
from handlers.generation.warm_up import WarmUp
from tests.hf_models import qwen2_lm


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    directory = qwen2_lm(tmp_path_factory.mktemp("lm"))
    return AutoModelForCausalLM.from_pretrained(directory).eval(), AutoTokenizer.from_pretrained(directory)


def counted(engine: Engine) -> dict[str, list]:
    """The runner's calls by kind, with a part's start position."""
    calls: dict[str, list] = {"decode": [], "part": [], "mixed": []}
    runner = engine.runner
    for kind in calls:
        method = getattr(runner, kind)

        def wrapper(*args, _method=method, _kind=kind, **kwargs):
            part = next((a for a in args if hasattr(a, "start")), None)
            calls[_kind].append(part.start if part is not None else None)
            return _method(*args, **kwargs)

        setattr(runner, kind, wrapper)
    return calls


@pytest.mark.parametrize("chunk", [256, None])
def test_every_kind_of_step_is_computed_and_the_chunk_timed_only_when_left_open(lm, chunk, monkeypatch):
    model, tokenizer = lm
    settings = GenerationSettings(max_sequences=3, context_length=256, prefill_chunk=chunk)
    engine = Engine(model, tokenizer.decode, set(), 3, 256, torch.float32, prefill_chunk=chunk or 0)
    # As a compiled forward that traces at its first calls (compiling here would take minutes).
    monkeypatch.setattr(Engine, "compiles_at_first_steps", True)
    calls = counted(engine)
    times = WarmUp(engine, tokenizer, settings).run()
    assert not engine.busy
    assert calls["decode"], "decode rows alone"
    assert calls["mixed"], "a prompt beside decode rows"
    assert any(start for start in calls["mixed"] if start), "a part from past a block found in the prefix cache"
    assert (times is None) == (chunk is not None)
    assert times is None or isinstance(times, StepTimes)


@pytest.mark.parametrize("chunk", [256, None])
def test_where_nothing_compiles_one_prompt_computes_each_kind_of_step_once(lm, chunk):
    model, tokenizer = lm  # eager: its forward compiles nothing
    settings = GenerationSettings(max_sequences=3, context_length=256, prefill_chunk=chunk)
    engine = Engine(model, tokenizer.decode, set(), 3, 256, torch.float32, prefill_chunk=chunk or 0)
    assert not engine.compiles_at_first_steps
    calls = counted(engine)
    times = WarmUp(engine, tokenizer, settings).run()
    assert not engine.busy
    if chunk:  # (an open chunk is timed by steps of its own)
        # The prompt from position 0 (a part: a mixed step of idle rows), then two decode steps.
        assert calls == {"decode": [None, None], "part": [0], "mixed": [0]}
    assert (times is None) == (chunk is not None)


def test_a_prompt_whose_shapes_fail_a_loaded_graphs_guards_is_followed_by_the_full_warm_up(lm, monkeypatch):
    model, tokenizer = lm
    settings = GenerationSettings(max_sequences=3, context_length=256, prefill_chunk=256)
    engine = Engine(model, tokenizer.decode, set(), 3, 256, torch.float32, prefill_chunk=256)
    calls = counted(engine)
    # As a forward whose graphs all loaded whole, until its first step's shapes fail their guards
    # and the traced forward computes it (compiling here would take minutes).
    traced = property(lambda self: bool(calls["decode"] or calls["mixed"]))
    monkeypatch.setattr(Engine, "compiles_at_first_steps", traced)
    WarmUp(engine, tokenizer, settings).run()
    assert calls["mixed"][0] == 0 and any(start for start in calls["mixed"] if start), calls  # then every size
    assert not engine.busy
