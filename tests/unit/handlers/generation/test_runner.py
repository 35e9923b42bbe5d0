"""handlers/generation/runner.py: the forwards a step computes, against transformers' own forward on
a tiny random Qwen2 (Llama-style, its attention the pluggable kind, so steps mix)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from handlers.generation.cache import KvShape, SlotCache
from handlers.generation.runner import MIN_ROWS, Part, Runner
from tests.hf_models import qwen2_lm

CONTEXT = 128
PROMPT = (5, 17, 3, 99, 42, 7, 250, 11, 64, 8, 1)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return AutoModelForCausalLM.from_pretrained(qwen2_lm(tmp_path_factory.mktemp("qwen2"))).eval()


def runner(model, slots: int) -> Runner:
    return Runner(model, SlotCache(KvShape.of(model.config), slots, CONTEXT, torch.float32), CONTEXT)


def transformers_logits(model, ids: tuple[int, ...]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def forwarded_rows(run: Runner) -> list[int]:
    """The rows of tokens each forward of `run` is given, as it runs."""
    rows: list[int] = []
    forward = run._forward

    def counting(ids, *args, **kwargs):
        rows.append(ids.shape[0] if "mixed" not in kwargs else kwargs["mixed"].decode_mask.shape[0])
        return forward(ids, *args, **kwargs)

    run._forward = counting
    return rows


@pytest.mark.parametrize(("slots", "rows"), [(4, MIN_ROWS), (1, 1)])
def test_a_lone_decode_row_is_computed_with_idle_rows_where_the_cache_has_them(model, slots, rows):
    """One sequence decoding is a forward of MIN_ROWS rows (a size of 1 would be a graph more to
    compile), the others idle at the scratch position; its logits are transformers'."""
    run = runner(model, slots)
    given = forwarded_rows(run)
    with torch.inference_mode():
        run.part(Part(0, PROMPT[:-1], 0, last=True))
        logits = run.decode([PROMPT[-1]], [len(PROMPT) - 1])
    assert given[-1] == rows and logits.shape[0] == rows
    torch.testing.assert_close(logits[0], transformers_logits(model, PROMPT)[-1], atol=1e-4, rtol=1e-4)


def test_a_part_alone_is_a_mixed_step_of_idle_rows_and_answers_as_transformers(model):
    """A prompt's part with no sequence decoding is computed by the mixed step (one graph fewer),
    its idle rows writing where nothing reads: a part after it in the same row still answers as
    transformers does over the whole prompt."""
    run = runner(model, 4)
    assert run.mixes
    given = forwarded_rows(run)
    with torch.inference_mode():
        run.part(Part(1, PROMPT[:8], 0, last=False))
        logits = run.part(Part(1, PROMPT[8:], 8, last=True))
    assert given == [MIN_ROWS, MIN_ROWS]  # both mixed steps, each with its idle decode rows
    torch.testing.assert_close(logits, transformers_logits(model, PROMPT)[-1], atol=1e-4, rtol=1e-4)
