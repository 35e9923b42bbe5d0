"""handlers/generation/chunking.py: the chunk chosen from step times, and those times measured on
a real engine (a tiny random Qwen2, eager) that is left as it was found."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import AutoModelForCausalLM

from handlers.generation.chunking import LEAST, MOST, PROBE, StepTimes
from handlers.generation.engine import Engine
from handlers.generation.sequences import Generation
from tests.hf_models import qwen2_lm


@pytest.mark.parametrize(
    ("decode", "token", "chunk"),
    [
        (0.100, 0.0035, 56),  # 2 cores, 16 slots: 2 decode steps' room holds 57 tokens
        (0.015, 0.0001, 296),  # a many-core server: 300 tokens, whole steps of 8
        (0.015, 0.000001, MOST),  # more would not compute faster per token
        (0.050, 0.1, LEAST),  # a slow prefill still moves
        (0.0, 0.0, MOST),  # one slot: nothing shares a step with a prompt
    ],
)
def test_the_chunk_keeps_a_mixed_step_within_three_decode_steps(decode, token, chunk):
    assert StepTimes(decode, token).chunk() == chunk


def test_measuring_leaves_the_engine_idle_with_its_chunk_and_nothing_found_by_requests(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(qwen2_lm(tmp_path)).eval()
    engine = Engine(model, str, set(), 4, 256, torch.float32, prefill_chunk=24)
    tokens = itertools.count(300)
    lengths: list[int] = []

    def prompt(length: int, new: int) -> Generation:
        lengths.append(length)
        return Generation((next(tokens),) * length, new, ignore_eos=True)

    times = StepTimes.measure(engine, prompt)
    # A tiny model's mixed step may time no longer than its decode step: never a negative cost.
    assert times.decode_seconds > 0 and times.token_seconds >= 0
    assert lengths.count(PROBE) == 5 and lengths.count(2) == engine.slots - 1
    assert not engine.busy and engine.prefill_chunk == 24
    # Each prompt was of a token of its own: a request's prompt finds none of their blocks.
    assert engine.prefix.place((5,) * 64, set(range(engine.slots))).found == 0
