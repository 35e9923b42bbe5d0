"""handlers/generation/kv_budget.py: rows' resident positions counted against the budget, and
which finished row is given back first."""

from __future__ import annotations

from handlers.generation.kv_budget import KvBudget


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
