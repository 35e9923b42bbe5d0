"""handlers/generation/blocks.py: blocks handed out lowest first, shared by refcount, findable by
their tokens and all before them, evicted least recently released."""

from __future__ import annotations

import pytest

from handlers.generation.blocks import NULL_BLOCK, BlockPool

SIZE = 4


def filled(pool: BlockPool, tokens: list[int]) -> tuple[list[int], list[bytes]]:
    """A holder that computed `tokens`: its blocks, registered."""
    table = pool.allocate(pool.needed(len(tokens), 0))
    keys: list[bytes] = []
    pool.register(tokens, table, keys)
    return table, keys


def test_blocks_are_handed_out_lowest_first_never_the_null_one_and_none_when_too_few():
    pool = BlockPool(blocks=5, block_size=SIZE)
    assert pool.allocate(2) == [1, 2]
    assert pool.allocate(3) is None and pool.available == 2  # nothing taken
    pool.release([1])
    assert pool.allocate(3) == [1, 3, 4] and NULL_BLOCK not in pool.free
    assert pool.available == 0 and pool.used == 4


def test_a_prefix_is_found_by_its_full_blocks_and_one_token_is_always_left_to_compute():
    pool = BlockPool(blocks=8, block_size=SIZE)
    tokens = list(range(10, 22))  # three full blocks
    table, keys = filled(pool, tokens)
    assert len(keys) == 3
    found, found_keys = pool.match(tokens)  # the same 12 tokens: the last block holds the last token
    assert found == table[:2] and found_keys == keys[:2]
    longer, _ = pool.match([*tokens, 99])
    assert longer == table
    other, _ = pool.match([10, 11, 12, 0, 14, 15, 16, 17, 18])  # differs in the first block
    assert other == []
    pool.release(found)
    pool.release(longer)
    assert pool.refs[table[0]] == 1  # the first holder still holds it


def test_a_block_is_keyed_by_all_tokens_before_it_not_only_its_own():
    pool = BlockPool(blocks=8, block_size=SIZE)
    filled(pool, [1, 2, 3, 4, 5, 6, 7, 8])
    found, _ = pool.match([9, 9, 9, 9, 5, 6, 7, 8, 0])  # the same second block after another first
    assert found == []


def test_released_blocks_stay_findable_until_needed_then_the_least_recently_released_goes_first():
    pool = BlockPool(blocks=5, block_size=SIZE)
    first, _ = filled(pool, [1, 2, 3, 4])
    second, _ = filled(pool, [5, 6, 7, 8])
    pool.release(first)
    pool.release(second)
    assert pool.available == 4 and pool.used == 0
    assert pool.match([5, 6, 7, 8, 0])[0] == second  # still findable; held again
    pool.release(second)  # released after `first`: evicted after it
    taken = pool.allocate(3)  # the two free ones, then the least recently released
    assert taken == [3, 4, first[0]]
    assert pool.match([1, 2, 3, 4, 0])[0] == []  # its tokens are gone with it
    assert pool.match([5, 6, 7, 8, 0])[0] == second


def test_a_block_holding_tokens_another_already_holds_stays_unfindable_and_is_freed():
    pool = BlockPool(blocks=6, block_size=SIZE)
    first, _ = filled(pool, [1, 2, 3, 4])
    twin, _ = filled(pool, [1, 2, 3, 4])  # computed at the same time, before the other was findable
    assert pool.match([1, 2, 3, 4, 0])[0] == first
    pool.release(twin)
    assert twin[0] in pool.free


def test_without_prefix_caching_nothing_is_found():
    pool = BlockPool(blocks=6, block_size=SIZE, prefix_caching=False)
    table, keys = filled(pool, [1, 2, 3, 4, 5])
    assert keys == [] and pool.match([1, 2, 3, 4, 5])[0] == []
    pool.release(table)
    assert pool.available == 5


def test_a_pool_needs_a_block_besides_the_null_one():
    with pytest.raises(ValueError, match="2 blocks or more"):
        BlockPool(blocks=1, block_size=SIZE)
