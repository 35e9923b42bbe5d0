"""handlers/generation/kv_budget.py: rows' resident positions counted against the budget, and
which finished row is given back first.
Through the engine (the models: conftest.py): sequences preempted and computed again, rows given
back, every answer transformers'."""

from __future__ import annotations

import pytest

from handlers.generation.kv_budget import KvBudget
from handlers.generation.runner import PROMPT_STEP
from handlers.generation.sequences import Generation
from tests.unit.handlers.generation.engines import (
    PROMPTS,
    REPEATING,
    Recorder,
    budgeted,
    reference,
)


def test_rows_count_their_high_water_mark_against_the_budget():
    budget = KvBudget(rows=3, positions=100)
    budget.hold({0: 40, 1: 30})
    assert budget.used == 70
    assert budget.fits({0: 41, 2: 29}) and not budget.fits({0: 41, 2: 30})
    budget.hold({0: 10})  # a row shorter now still holds what it wrote
    assert budget.held[0] == 40 and budget.extra({0: 45, 1: 5}) == 5


def test_the_finished_row_used_least_recently_goes_first_and_holds_nothing_after():
    budget = KvBudget(rows=4, positions=100)
    budget.hold({2: 10})
    budget.hold({1: 10})
    budget.hold({3: 10})
    budget.hold({2: 12})  # used again: the most recent
    assert budget.coldest({1, 2, 3}) == 1
    budget.release(1)
    assert budget.held[1] == 0 and budget.coldest({1, 2, 3}) == 3
    assert budget.coldest({0}) is None  # holds nothing: nothing to give back


def test_a_sequence_has_room_once_the_rows_not_in_use_are_given_back():
    budget = KvBudget(rows=3, positions=100)
    budget.hold({0: 50, 1: 45})
    assert budget.room_for(50, rows=[0])  # row 1 is finished: it can be given back
    assert not budget.room_for(51, rows=[0])
    assert not budget.room_for(10, rows=[0, 1])


# -- through the engine, against transformers' greedy answers --------------------
@pytest.mark.parametrize("options", [{}, {"prefill_chunk": 16}, {"lookup": 4}])
def test_sequences_beyond_the_budget_are_preempted_and_computed_again_to_transformers_answers(lm, options):
    """Three sequences of 100 tokens in a budget of one context (256 positions): they cannot all
    finish in it, so the youngest is put back and computed again from its prompt and tokens;
    every answer is still transformers' greedy one, and its usage the request's."""
    model, tokenizer = lm
    prompts = [REPEATING, PROMPTS[0], PROMPTS[2]]
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    new = 100
    expected = [reference(model, i, new) for i in ids]
    eng = budgeted(model, tokenizer, 256, **options)
    sequences = [eng.submit(Generation(tuple(i), new), Recorder()) for i in ids]
    eng.step()
    assert all(s.slot >= 0 for s in sequences)  # short prompts: all three admitted at once
    peak = 0
    while eng.busy:
        eng.step()
        peak = max(peak, eng.budget.used)
        assert eng.budget.used <= 256
    assert [s.tokens for s in sequences] == expected
    assert [(s.sink.usage.prompt_tokens, s.sink.usage.completion_tokens) for s in sequences] == [
        (len(i), new) for i in ids
    ]
    assert eng.metrics.preemptions >= 1 and sum(s.preemptions for s in sequences) == eng.metrics.preemptions
    assert sum(eng.metrics.queue.counts) == 3  # each request admitted once, whatever it was computed again for
    assert peak > 200


def test_a_sequence_waits_for_room_in_the_budget_and_not_for_a_slot(lm):
    """A prompt longer than what the budget has left beside a sequence in flight waits (a slot is
    free), and is admitted when the first ends; one that fits beside it is admitted at once."""
    model, tokenizer = lm
    long = tokenizer(PROMPTS[2] * 3)["input_ids"]
    short = tokenizer(PROMPTS[0])["input_ids"]
    assert 256 < len(long) < 480
    eng = budgeted(model, tokenizer, 512, slots=3, context=512)  # not two of them
    first = eng.submit(Generation(tuple(long), 20), Recorder())
    eng.step()
    second = eng.submit(Generation(tuple(long), 4), Recorder())
    eng.step()
    assert first.slot >= 0 and second.slot == -1 and len(eng.waiting) == 1
    while first.sink.reason is None:
        eng.step()
    third = eng.submit(Generation(tuple(short), 4), Recorder())
    eng.step()
    assert second.slot >= 0 and third.slot >= 0
    while eng.busy:
        eng.step()
    assert second.tokens == reference(model, long, 4) and eng.metrics.preemptions == 0


def test_a_finished_rows_prefix_stays_until_its_room_is_needed_then_it_is_given_back(lm):
    """Two finished rows hold their prompts while the budget has room (the first is found again
    whole); a prompt that needs their room takes the lowest row, and the other finished row is
    given back: its prefix forgotten, its positions zero, the budget's total within its limit."""
    model, tokenizer = lm
    system = tokenizer(PROMPTS[2])["input_ids"]
    other = tokenizer(PROMPTS[0] * 8)["input_ids"]
    context = 2 * len(system)
    eng = budgeted(model, tokenizer, context + 16, slots=3, context=context)
    pair = [eng.submit(Generation(tuple(ids), 1), Recorder()) for ids in (system, other)]
    while eng.busy:
        eng.step()
    assert [s.slot for s in pair] == [0, 1] and eng.budget.held[1] > 0 and eng.prefix.keys[1]
    again = eng.submit(Generation(tuple(system), 2), Recorder())
    eng.step()
    assert again.slot == 0 and again.computed >= len(system) // 16 * 16  # found: nothing was given back
    while eng.busy:
        eng.step()
    big = tuple(tokenizer(PROMPTS[3] * 60)["input_ids"][: context - 8])
    eng.submit(Generation(big, 2), Recorder())
    while eng.busy:
        eng.step()
        assert eng.budget.used <= context + 16
    assert eng.budget.held[1] == 0 and not eng.prefix.keys[1]  # its pages: test_cache.py


def test_a_prompts_padding_is_counted_with_the_positions_it_writes(lm):
    """A prompt's last part is padded to a multiple of PROMPT_STEP, and the padding is written in
    the cache as the prompt is: the budget counts those positions too (they are resident)."""
    model, tokenizer = lm
    ids = tokenizer(PROMPTS[2])["input_ids"]
    ids = ids[: len(ids) // PROMPT_STEP * PROMPT_STEP - 3]  # 5 positions of padding
    eng = budgeted(model, tokenizer, 256)
    sequence = eng.submit(Generation(tuple(ids), 3), Recorder())
    eng.step()  # the prompt, whole, and its first token chosen
    padded = len(ids) + 3
    written = eng.cache.keys[0, sequence.slot, 0].abs().sum(-1) > 0
    assert written[:padded].all() and not written[padded : eng.cache.scratch].any()  # idle rows write at scratch
    assert eng.budget.held[sequence.slot] == padded
    while eng.busy:
        eng.step()
    assert sequence.tokens == reference(model, ids, 3)


def test_a_budget_below_one_context_is_refused_with_the_numbers(lm):
    model, tokenizer = lm
    with pytest.raises(ValueError, match="100 positions holds less than one context \\(256\\)"):
        budgeted(model, tokenizer, 100)


def shared_prefix_after_finished_rows(model, tokenizer, slots: int, filler: bool):
    """An engine whose rows hold, finished: a short prompt (row 0), a prompt of PROMPTS[2] and
    " Why?" (row 1) and, with `filler`, another short one (row 2); its last row runs a long answer.
    Returns it, the runner, the prompt sharing row 1's blocks and the blocks' positions."""
    system = tokenizer(PROMPTS[2])["input_ids"]
    first, second = system + tokenizer(" Why?")["input_ids"], system + tokenizer(" And then")["input_ids"]
    eng = budgeted(model, tokenizer, 256, slots=slots, context=256, block_size=16)
    short = [tokenizer("fox")["input_ids"], first] + ([tokenizer(PROMPTS[3])["input_ids"]] if filler else [])
    finished = [eng.submit(Generation(tuple(ids), 1), Recorder()) for ids in short]
    runner = eng.submit(Generation(tuple(tokenizer(PROMPTS[0])["input_ids"]), 200), Recorder())
    while not all(s.sink.reason for s in finished):
        eng.step()
    assert [s.slot for s in (*finished, runner)] == list(range(slots))
    return eng, runner, second, len(system) // 16 * 16  # the blocks the two prompts share


@pytest.mark.parametrize("filler", [True, False])
def test_a_prefix_in_a_finished_row_is_copied_when_room_is_made_without_giving_that_row_back(lm, filler):
    """A new sequence takes the lowest free row and its prefix is in another finished row: room
    for the copy is made by giving back other finished rows, never the one copied from (the copy
    would read zeros). With no other to give back, the blocks are computed instead. Either way
    the answer is transformers' and the budget is kept."""
    model, tokenizer = lm
    eng, runner, second, found = shared_prefix_after_finished_rows(model, tokenizer, 4 if filler else 3, filler)
    # The runner grows until placing the second in row 0 needs finished rows given back.
    while eng.budget.used + max(0, found - eng.budget.held[0]) <= 256:
        eng.step()
    assert eng.budget.held[runner.slot] + len(second) <= 256  # it is admitted at once
    hits = eng.prefix.stats.hits
    later = eng.submit(Generation(tuple(second), 8), Recorder())
    eng.step()
    assert later.slot == 0
    assert eng.prefix.stats.hits - hits == (found if filler else 0)  # copied, or computed
    assert eng.budget.held[2] == 0 if filler else eng.budget.held[1] == 0  # the filler given back, else the source
    while eng.busy:
        eng.step()


def test_what_the_prefix_store_holds_counts_in_use_and_leaves_room_for_no_more():
    stored = [32]
    budget = KvBudget(rows=2, positions=100, stored=lambda: stored[0])
    budget.hold({0: 60})
    assert budget.used == 92 and budget.room(8) and not budget.room(9)
    assert not budget.fits({1: 9}) and budget.fits({1: 8})
    stored[0] = 0  # read as it is now: the store gave its blocks up
    assert budget.used == 60 and budget.fits({1: 40})
