"""handlers/generation/prefix.py: a prompt finds the blocks a row holds of it (keyed by all tokens
before them), goes where nothing is lost or else to the lowest row, and is told what to copy."""

from __future__ import annotations

from handlers.generation.prefix import Place, PrefixCache

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
