"""The KV cache's resident positions against the budget the memory plan gives it.

    budget = KvBudget(rows=16, positions=4 * 2048)   # 16 sequences at once, 4 full contexts of memory
    budget.fits({3: 120, 5: 17})     # rows 3 and 5 are to hold this many positions: room for them?
    budget.hold({3: 120, 5: 17})     # they do now
    budget.coldest(free={2, 7})      # the free row to give back first (least recently used), or None
    budget.release(2)                # its pages went back to the system (cache.SlotCache.release)
    KvBudget(16, 4 * 2048, stored=lambda: len(store) * 16)   # the prefix store's positions counted too

The cache maps a full row of context positions for every sequence generated at once, untouched
(cache.py): a page is resident once written. What the worker's memory holds is then each row's
highest position written, its high-water mark, whatever the sequence in it now needs. The budget
counts those marks, so that the memory the load makes resident stays within what the plan sized
(a number of full contexts), while short sequences, many at once, share it: a sequence holds the
positions it has written, not a context's worth (vAttention's idea, the OS's page table as the
block table: no gather in the attention, whose views stay a row's).

A row whose sequence ended keeps its positions (its prefix can be found again: prefix.py) until
the room is needed: then the prefix store's blocks go first (`stored`: what a taken row held,
prefix_store.py), then the least recently used row is given back. When only rows in use are
left, the engine preempts its youngest sequence (engine.py) and computes it again later.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping


def nothing_stored() -> int:
    return 0


class KvBudget:
    def __init__(self, rows: int, positions: int, stored: Callable[[], int] = nothing_stored):
        self.positions = positions  # the most the rows (and the prefix store) may hold together
        self.held = [0] * rows  # each row's high-water mark: its positions resident
        self.stored = stored  # the positions the prefix store holds beside the rows now (prefix_store.py)
        self.used_at = [0] * rows  # when each row was last used (a tick): the least recent goes first
        self._ticks = itertools.count(1)

    @property
    def used(self) -> int:
        return sum(self.held) + self.stored()

    def extra(self, targets: Mapping[int, int]) -> int:
        """Positions beyond those held that rows holding `targets` ({row: positions}) take."""
        return sum(max(0, count - self.held[row]) for row, count in targets.items())

    def fits(self, targets: Mapping[int, int]) -> bool:
        return self.used + self.extra(targets) <= self.positions

    def hold(self, targets: Mapping[int, int]) -> None:
        """The rows hold (at least) these positions now, and are the most recently used."""
        for row, count in targets.items():
            self.held[row] = max(self.held[row], count)
            self.used_at[row] = next(self._ticks)

    def release(self, row: int) -> None:
        self.held[row] = 0

    def room(self, count: int) -> bool:
        """Whether `count` more positions fit beside what is held now (the prefix store's next block)."""
        return self.used + count <= self.positions

    def coldest(self, free: Collection[int]) -> int | None:
        """The free row holding positions that was used least recently; None when none holds any."""
        holding = [row for row in free if self.held[row]]
        return min(holding, key=lambda row: self.used_at[row]) if holding else None

    def room_for(self, count: int, rows: Collection[int]) -> bool:
        """Whether a sequence of `count` positions fits beside `rows` (those in use) once the
        other rows are given back."""
        return sum(self.held[row] for row in rows) + count <= self.positions
