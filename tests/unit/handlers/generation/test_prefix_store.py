"""handlers/generation/prefix_store.py: blocks kept by key, taken out once, the least recently
kept dropped first. Through the engine (the models: conftest.py): a prompt whose row another
sequence took finds its blocks in the store, within its size and the KV budget, the store given
up before any row, and every answer is still transformers'."""

from __future__ import annotations

import torch

from handlers.generation.cache import KvShape
from handlers.generation.prefix_store import PrefixStore
from handlers.generation.sequences import Generation
from tests.unit.handlers.generation.engines import (
    PROMPTS,
    Recorder,
    budgeted,
    counted,
    engine,
    reference,
)

BIG = 10**9  # bytes: a store that never fills in these tests


def test_a_block_is_taken_out_once_and_the_least_recently_kept_goes_first():
    store = PrefixStore()
    store.keep(b"a", (torch.zeros(1),))
    store.keep(b"b", (torch.ones(1),))
    store.keep(b"a", (torch.full((1,), 2.0),))  # kept again: the most recent now
    assert len(store) == 2 and b"a" in store
    assert store.evict() and b"b" not in store and len(store) == 1
    assert store.take(b"a")[0].item() == 2.0 and store.take(b"a") is None
    assert not store.evict()  # empty


def run_alone(eng, ids: list[int], new: int, forwards: list[int]):
    forwards.clear()
    sequence = eng.submit(Generation(tuple(ids), new), Recorder())
    while eng.busy:
        eng.step()
    return sequence, forwards[0]


def test_a_prompt_whose_row_was_taken_finds_its_blocks_in_the_store_and_answers_are_transformers(lm):
    """One row: a long prompt, then another prompt in its row, then the first again. Without the
    store the third is computed whole; with it, all but its last block are copied back. Blocks of
    4 positions: they end inside the prompts."""
    model, tokenizer = lm
    first, other = tokenizer(PROMPTS[2])["input_ids"], tokenizer(PROMPTS[0])["input_ids"]
    for store_bytes in (0, BIG):
        eng = engine(model, tokenizer, slots=1, block_size=4, prefix_store_bytes=store_bytes)
        forwards = counted(eng)
        answers = [run_alone(eng, ids, 6, forwards) for ids in (first, other, first)]
        assert [s.tokens for s, _ in answers] == [reference(model, ids, 6) for ids in (first, other, first)]
        _, computed = answers[2]
        if store_bytes:
            assert computed <= 4 + 8  # all but its last block found (a part is padded to 8)
            found = (len(first) - 1) // 4 * 4
            assert eng.prefix.stats.hits >= found
            # Taken out, into the row; what stays (the answers' blocks) counts in the budget.
            assert not any(key in eng.store for key in eng.prefix.chain(first[:-1]))
            assert len(eng.store) > 0 and eng.budget.used == sum(eng.budget.held) + 4 * len(eng.store)
            # The metrics port's gauge: those blocks' bytes.
            token_bytes = eng.cache.shape.token_bytes(torch.float32)
            assert eng.gauges().prefix_store_bytes == 4 * len(eng.store) * token_bytes
        else:
            assert computed >= len(first) and len(eng.store) == 0


def test_the_store_keeps_no_more_than_its_size(lm):
    model, tokenizer = lm
    first, other = tokenizer(PROMPTS[2])["input_ids"], tokenizer(PROMPTS[0])["input_ids"]
    token_bytes = KvShape.of(model.config).token_bytes(torch.float32)
    # Room for 3 blocks of 4 positions: the first 3 of the first prompt's blocks are kept.
    eng = engine(model, tokenizer, slots=1, block_size=4, prefix_store_bytes=12 * token_bytes + 1)
    forwards = counted(eng)
    for ids in (first, other):
        run_alone(eng, ids, 2, forwards)
    assert len(eng.store) == 3 and eng.gauges().prefix_store_bytes == 12 * token_bytes
    _, computed = run_alone(eng, first, 2, forwards)
    assert len(first) - 12 <= computed  # 3 blocks found, the rest computed


def test_room_for_a_sequence_is_made_from_the_store_before_any_row(lm):
    """Rows 0 and 1 finish holding two prompts; a third takes row 0 and the first's blocks go to
    the store. A long sequence then needs more room than is free: the store's blocks are given
    up, and row 1, which fits beside it, keeps its prompt findable."""
    model, tokenizer = lm
    long, short, other = (tokenizer(PROMPTS[i])["input_ids"] for i in (2, 3, 0))
    positions = 240
    eng = budgeted(
        model, tokenizer, positions=positions, slots=2, context=positions, prefix_store_bytes=BIG, block_size=4
    )
    first, second = (eng.submit(Generation(tuple(ids), 4), Recorder()) for ids in (long, short))
    while eng.busy:
        eng.step()
    third = eng.submit(Generation(tuple(other), 4), Recorder())
    while eng.busy:
        eng.step()
    assert (first.slot, second.slot, third.slot) == (0, 1, 0) and eng.budget.stored() >= 8
    stored, row_one = eng.budget.stored(), eng.budget.held[1]
    ids = (long * 8)[: positions - row_one - 8]  # fits beside row 1 only once the store is given up
    big = eng.submit(Generation(tuple(ids), 4), Recorder())
    while eng.busy:
        eng.step()
    assert big.slot == 0 and eng.budget.stored() < stored and eng.budget.held[1] == row_one
    assert eng.prefix.keys[1] and eng.budget.used <= positions
    assert [s.tokens for s in (first, second, third, big)] == [
        reference(model, i, 4) for i in (long, short, other, ids)
    ]


def test_the_store_holds_whole_blocks_of_its_size_and_none_without_prefix_caching(lm):
    model, tokenizer = lm
    token_bytes = KvShape.of(model.config).token_bytes(torch.float32)
    sized = engine(model, tokenizer, block_size=16, prefix_store_bytes=33 * 16 * token_bytes - 1)
    assert sized.store_blocks == 32
    off = engine(model, tokenizer, prefix_caching=False, prefix_store_bytes=BIG)
    assert off.store_blocks == 0
