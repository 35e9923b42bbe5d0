"""handlers/generation/prefix.py: a prompt finds the blocks a row holds of it (keyed by all tokens
before them), goes where nothing is lost or else to the lowest row, and is told what to copy.
Through the engine (the models: conftest.py): a shared prefix is computed once and every answer
is still transformers'."""

from __future__ import annotations

from handlers.generation.prefix import Place, PrefixCache
from handlers.generation.runner import MIN_ROWS
from handlers.generation.sequences import Generation
from tests.unit.handlers.generation.engines import (
    PROMPTS,
    Recorder,
    counted,
    engine,
    reference,
)

SIZE = 4


def test_a_prompt_goes_to_the_free_row_holding_its_beginning_and_one_token_is_left_to_compute():
    prefix = PrefixCache(rows=3, block_size=SIZE)
    prefix.computed(1, list(range(12)))  # three full blocks
    assert prefix.place([*range(12), 99], free={0, 1, 2}) == Place(row=1, found=12, held=12)
    prefix.computed(1, [*range(12), 99])
    # The same 12 tokens: the last block's last token is computed again (its logits are the first token's).
    assert prefix.place(list(range(12)), free={0, 1, 2}) == Place(row=0, found=8, source=1, held=0)
    assert prefix.stats.queries == 25 and prefix.stats.hits == 20


def test_a_block_is_keyed_by_all_tokens_before_it_not_only_its_own():
    prefix = PrefixCache(rows=2, block_size=SIZE)
    prefix.computed(0, [1, 2, 3, 4, 5, 6, 7, 8])
    assert prefix.place([9, 9, 9, 9, 5, 6, 7, 8, 0], free={1}).found == 0


def test_a_row_whose_own_blocks_would_be_lost_is_left_and_what_it_holds_is_copied_to_the_lowest():
    prefix = PrefixCache(rows=3, block_size=SIZE)
    system = [7, 7, 7, 7, 8, 8, 8, 8]
    prefix.computed(2, [*system, 1, 1, 1, 1, 2])
    assert prefix.place([*system, 3, 3, 3, 3, 4], free={0, 1, 2}) == Place(row=0, found=8, source=2, held=0)
    prefix.computed(0, [*system, 3, 3, 3, 3])
    assert prefix.place([*system, 1, 1, 1, 1, 2], free={1, 2}) == Place(row=2, found=12, held=12)


def test_a_prefix_in_a_row_still_generating_is_copied_into_a_free_one():
    prefix = PrefixCache(rows=2, block_size=SIZE)
    prefix.computed(0, [5, 5, 5, 5, 6, 6, 6, 6, 7])  # row 0 generating: not free
    assert prefix.place([5, 5, 5, 5, 6, 6, 6, 6, 9], free={1}) == Place(row=1, found=8, source=0, held=0)


def test_a_taken_rows_other_blocks_are_forgotten():
    prefix = PrefixCache(rows=2, block_size=SIZE)
    prefix.computed(0, [1, 1, 1, 1, 2, 2, 2, 2])
    assert prefix.place([1, 1, 1, 1, 3, 3, 3, 3, 3], free={0}) == Place(row=0, found=4, held=4)
    assert prefix.place([1, 1, 1, 1, 2, 2, 2, 2, 2], free={1}).found == 4  # its second block is gone


def test_without_prefix_caching_nothing_is_found():
    prefix = PrefixCache(rows=2, block_size=SIZE, enabled=False)
    prefix.computed(0, [1, 2, 3, 4, 5])
    assert prefix.place([1, 2, 3, 4, 5], free={0, 1}) == Place(row=0, found=0) and prefix.stats.hits == 0


# -- through the engine, against transformers' greedy answers --------------------
def test_a_shared_prefix_is_computed_once_and_later_answers_are_still_transformers(lm):
    """Prefix caching: a second prompt that begins with the first's 6 full blocks (a system prompt)
    computes only what follows them; the same prompt asked again, all but its last block."""
    model, tokenizer = lm
    system = tokenizer(PROMPTS[2])["input_ids"]
    first, second = system + tokenizer(" Why?")["input_ids"], system + tokenizer(" And then")["input_ids"]
    eng = engine(model, tokenizer, slots=2, block_size=16)
    forwards = counted(eng)
    answers = []
    for ids in (first, second, second):
        sequence = eng.submit(Generation(tuple(ids), 6), Recorder())
        forwards.clear()
        while eng.busy:
            eng.step()
        answers.append((sequence.tokens, forwards[0]))
    assert [tokens for tokens, _ in answers] == [reference(model, i, 6) for i in (first, second, second)]
    shared = len(system) // 16 * 16
    assert answers[0][1] >= len(first)  # computed whole
    # The rest after the shared blocks (padded to 8), with the idle decode rows of a part's step.
    assert answers[1][1] < len(second) - shared + 8 + MIN_ROWS
    assert answers[2][1] <= 16 + MIN_ROWS  # all but its last block found
    assert eng.prefix.stats.hits >= 2 * shared and eng.prefix.stats.queries == len(first) + 2 * len(second)


def test_a_prefix_another_slot_holds_while_generating_is_copied_and_answers_are_transformers(lm):
    """Two requests with one system prompt, the second arriving while the first generates: its
    slot is another, the shared blocks are copied from the first's row, and both answers are the
    ones each would have alone. Blocks of 4 positions: they end inside prompts and answers."""
    model, tokenizer = lm
    system = tokenizer(PROMPTS[2])["input_ids"]
    first, second = system + tokenizer(" Why?")["input_ids"], system + tokenizer(" And then")["input_ids"]
    eng = engine(model, tokenizer, slots=2, block_size=4, chunk=16)
    forwards = counted(eng)
    one = eng.submit(Generation(tuple(first), 30), Recorder())
    while not one.tokens:
        eng.step()
    forwards.clear()
    two = eng.submit(Generation(tuple(second), 30), Recorder())
    eng.step()
    assert two.slot != one.slot and two.computed > len(system) - 4
    assert forwards[0] < 16 + 2  # the rest of the second prompt and the first's decode row: one mixed forward
    while eng.busy:
        eng.step()
    assert [one.tokens, two.tokens] == [reference(model, first, 30), reference(model, second, 30)]


def test_without_prefix_caching_every_prompt_is_computed_whole(lm):
    model, tokenizer = lm
    ids = tokenizer(PROMPTS[2])["input_ids"]
    eng = engine(model, tokenizer, slots=1, prefix_caching=False)
    forwards = counted(eng)
    for _ in range(2):
        forwards.clear()
        sequence = eng.submit(Generation(tuple(ids), 3), Recorder())
        while eng.busy:
            eng.step()
        assert forwards[0] >= len(ids) and sequence.tokens == reference(model, ids, 3)
    assert eng.prefix.stats.hits == 0


def test_a_free_slots_prefix_is_not_overwritten_by_other_slots_steps(lm):
    """A slot with nothing to compute writes at the cache's scratch position: a prompt left in a
    free slot's row is found whole after another sequence generated beside it for many steps."""
    model, tokenizer = lm
    long = tokenizer(PROMPTS[2])["input_ids"]
    eng = engine(model, tokenizer, slots=2)
    beside = eng.submit(Generation(tuple(tokenizer(PROMPTS[0])["input_ids"]), 60), Recorder())
    kept = eng.submit(Generation(tuple(long), 2), Recorder())
    while kept.slot in eng.active:
        eng.step()
    for _ in range(20):
        eng.step()  # the kept row idle in each decode step
    again = eng.submit(Generation(tuple(long), 8), Recorder())
    eng.step()
    assert again.slot == kept.slot == 1 and beside.slot == 0
    assert again.computed >= (len(long) - 1) // 16 * 16  # every full block of its prompt found
    while eng.busy:
        eng.step()
    assert again.tokens == reference(model, long, 8) and beside.tokens == reference(model, beside.generation.prompt, 60)
