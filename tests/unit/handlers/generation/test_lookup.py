"""handlers/generation/lookup.py: drafts from the latest earlier occurrence of a text's last tokens.
Through the engine (the models: conftest.py): drafts kept or refused, every answer transformers'."""

from __future__ import annotations

import pytest
import torch

from handlers.generation.engine import Engine
from handlers.generation.lookup import PAUSE_MOST, AcceptanceLog, guess
from handlers.generation.sampling import Sampling
from handlers.generation.sequences import Finish, Generation
from tests.unit.handlers.generation.engines import (
    PROMPTS,
    REPEATING,
    Recorder,
    reference,
)


@pytest.mark.parametrize(
    ("tokens", "size", "want"),
    [
        ([1, 2, 3, 4, 9, 2, 3], 2, (4, 9)),  # "2 3" occurred before: what followed it
        ([1, 2, 3, 7, 2, 3, 8, 2, 3], 3, (8, 2, 3)),  # the latest occurrence with 3 after it
        ([1, 2, 3, 7, 2, 3, 8, 2, 3], 4, (7, 2, 3, 8)),  # the latest with 4 after it
        ([9, 9, 9, 9, 9, 9], 3, (9, 9, 9)),  # a run: not the occurrence just before the end
        ([5, 6, 7, 5, 6, 1, 6], 4, (7, 5, 6, 1)),  # no "1 6" nor "6 1 6" before: "6" alone, 4 after it
        ([1, 2, 3], 4, ()),  # nothing repeats
        ([4, 4], 3, (4,)),  # only what exists follows
        ([1, 2, 1], 0, ()),
    ],
)
def test_a_draft_is_what_followed_the_last_tokens_before(tokens, size, want):
    assert guess(tokens, size) == want


def test_the_acceptance_is_logged_when_it_changed_at_most_once_a_minute():
    said = AcceptanceLog()
    assert said.line(100.0, 8, 6) == "prompt lookup kept 6 of 8 drafted tokens (75%)"
    assert said.line(130.0, 12, 9) is None  # said; not again within the minute
    assert said.line(200.0, 8, 6) is None  # nothing new drafted since
    assert said.line(200.0, 12, 9) == "prompt lookup kept 9 of 12 drafted tokens (75%)"


# -- through the engine, against transformers' greedy answers --------------------
@pytest.mark.parametrize("chunk", [0, 16])
def test_prompt_lookup_gives_transformers_greedy_answers_and_keeps_drafts(lm, chunk):
    """Drafts from each sequence's own text, checked a sequence a step beside the others' rows (or
    alone where the model does not mix): every answer is transformers' greedy one."""
    model, tokenizer = lm
    prompts = [REPEATING, PROMPTS[0], PROMPTS[2]]
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    new = 24
    expected = [reference(model, i, new) for i in ids]
    eng = Engine(model, tokenizer.decode, set(), 3, 256, torch.float32, prefill_chunk=chunk, lookup=4)
    sequences = [eng.submit(Generation(tuple(i), new), Recorder()) for i in ids]
    while eng.busy:
        eng.step()
    assert [s.tokens for s in sequences] == expected
    assert all(s.sink.reason is Finish.LENGTH and s.sink.usage.completion_tokens == new for s in sequences)
    assert eng.metrics.draft_tokens > 0


def test_kept_drafts_write_several_tokens_a_step(lm):
    """An answer the model writes as its prompt does (a logit bias makes it one token over and
    over): each step keeps the drafted tokens, so the answer takes a few steps, not one a token."""
    model, tokenizer = lm
    ids = tuple(tokenizer(REPEATING)["input_ids"])
    favourite = ids[1]
    eng = Engine(model, tokenizer.decode, set(), 2, 256, torch.float32, lookup=4)
    sequence = eng.submit(Generation(ids, 21, Sampling(logit_bias=((favourite, 100.0),))), Recorder())
    steps = 0
    while eng.busy:
        eng.step()
        steps += 1
    assert sequence.tokens == [favourite] * 21
    # The first drafts come from the prompt (what followed that token there) and are dropped; then
    # the answer's own repeats are kept, up to 5 tokens a step (4 drafted and the next).
    assert eng.metrics.accepted_tokens >= 12 and steps <= 1 + 21 // 2, (eng.metrics.accepted_tokens, steps)
    usage = sequence.sink.usage  # what its answer's usage tells the client
    assert (usage.accepted_drafts, usage.rejected_drafts) == (
        eng.metrics.accepted_tokens,
        eng.metrics.draft_tokens - eng.metrics.accepted_tokens,
    )


def test_refused_drafts_pause_a_sequences_drafts_longer_each_time(lm):
    """Free text repeats nothing: after each wholly refused draft the sequence drafts again only
    2, 4, 8, ... PAUSE_MOST tokens later; a kept draft ends the pause."""
    model, tokenizer = lm
    eng = Engine(model, tokenizer.decode, set(), 2, 256, torch.float32, lookup=4)
    sequence = eng.submit(Generation((1, 2, 3), 200), Recorder())
    pauses = []
    for _ in range(7):
        eng._drafts_kept(sequence, 4, 0)
        pauses.append(sequence.draft_at - len(sequence.tokens))
    assert pauses == [2, 4, 8, 16, 32, 32, 32][: len(pauses)] and PAUSE_MOST == 32
    eng._drafts_kept(sequence, 4, 1)
    assert sequence.refusals == 0 and (sequence.drafted, sequence.kept) == (32, 1)


def test_prompt_lookup_keeps_a_seeded_samples_draws_and_its_logprobs(lm):
    """A sampled sequence draws once per token it keeps, from the logits its kept text gives:
    seeded, its tokens and log-probabilities are plain decoding's."""
    model, tokenizer = lm
    ids = tuple(tokenizer(REPEATING)["input_ids"])
    sampled = Generation(ids, 16, Sampling(temperature=0.5, seed=3), logprobs=2)
    answers = []
    for lookup in (0, 4):
        eng = Engine(model, tokenizer.decode, set(), 2, 256, torch.float32, lookup=lookup)
        recorder = Recorder()
        sequence = eng.submit(sampled, recorder)
        while eng.busy:
            eng.step()
        answers.append((sequence.tokens, [round(e.logprob, 4) for e in recorder.logprobs]))
    assert answers[0] == answers[1]


def test_prompt_lookup_stops_at_an_end_token_inside_a_kept_draft(lm):
    model, tokenizer = lm
    ids = tokenizer(REPEATING)["input_ids"]
    plain = reference(model, ids, 12)
    end = plain[5]  # a token the answer writes: it ends the answer there, drafted or not
    eng = Engine(model, tokenizer.decode, {end}, 2, 256, torch.float32, lookup=4)
    sequence = eng.submit(Generation(tuple(ids), 12), Recorder())
    while eng.busy:
        eng.step()
    assert sequence.tokens == plain[: plain.index(end)] and sequence.sink.reason is Finish.STOP
