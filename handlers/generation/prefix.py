"""The prefix cache over the KV cache's rows: which rows hold which token blocks, and all before them.

    prefix = PrefixCache(rows=16, block_size=16)
    place = prefix.place(tokens, free={2, 5})   # Place(row=5, found=48, source=None)
    cache.copy(place.source, place.row, ...)     # when the blocks are in a row still generating
    prefix.computed(5, tokens[:computed])        # the row's full blocks, findable (until the row is taken)

A row's full blocks of `block_size` tokens are keyed by a digest of their tokens and of every
token before them (a chain), so a prompt that begins with the same tokens as what a row holds
finds them and computes only the rest (a shared system prompt is computed once; a
conversation's earlier turns too). A new sequence goes into a free row holding only what its
prompt begins with, else the lowest free row; when another row (free or generating) holds more
of the prompt, those blocks are copied into the new row (a copy of the keys and values costs far
less than computing them again). At least one token is left to
compute: its forward gives the sequence's first logits.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Collection, Sequence

DIGEST_BYTES = 16  # blake2b's: a collision between two prefixes is not a concern at 128 bits


def digest(parent: bytes, tokens: Sequence[int]) -> bytes:
    """A full block's key: its tokens after the prefix whose key is `parent`."""
    hasher = hashlib.blake2b(parent, digest_size=DIGEST_BYTES)
    hasher.update(b"".join(t.to_bytes(8, "little", signed=True) for t in tokens))
    return hasher.digest()


@dataclasses.dataclass
class PrefixStats:
    """Prompt tokens looked up, and found (vLLM's prefix_cache_queries / prefix_cache_hits)."""

    queries: int = 0
    hits: int = 0


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a sequence goes: its row, and how many of its first positions are there already once
    positions [held, found) are copied from row `source` (None: nothing to copy)."""

    row: int
    found: int
    source: int | None = None
    held: int = 0
    # The row's blocks from `held` on, forgotten as it is taken: still in the row's cache until
    # the sequence writes there (the prefix store may keep them).
    dropped: tuple[bytes, ...] = dataclasses.field(default=(), compare=False)
    chain: tuple[bytes, ...] = dataclasses.field(default=(), compare=False)  # the prompt's full blocks' keys


class PrefixCache:
    def __init__(self, rows: int, block_size: int, enabled: bool = True):
        self.block_size, self.enabled = block_size, enabled
        self.keys: list[list[bytes]] = [[] for _ in range(rows)]  # each row's full blocks, in order
        self.holders: dict[bytes, set[int]] = {}
        self.stats = PrefixStats()

    def chain(self, tokens: Sequence[int], start: int = 0, parent: bytes = b"") -> list[bytes]:
        """The keys of `tokens`' full blocks from block `start` on (`parent`: the key before it)."""
        keys = []
        for index in range(start, len(tokens) // self.block_size):
            parent = digest(parent, tokens[index * self.block_size : (index + 1) * self.block_size])
            keys.append(parent)
        return keys

    def _common(self, row: int, chain: Sequence[bytes]) -> int:
        """How many of `chain`'s first blocks the row holds."""
        held = 0
        for mine, theirs in zip(self.keys[row], chain, strict=False):
            if mine != theirs:
                break
            held += 1
        return held

    def place(self, tokens: Sequence[int], free: Collection[int]) -> Place:
        """The free row for a sequence whose cache is to hold `tokens`: one holding only what the
        prompt begins with (nothing of it lost), the most of it, else the lowest (a decode step
        computes every row up to the highest in use: low rows keep it short). What another row
        holds of the prompt beyond the chosen row's is copied; the row's other blocks are forgotten."""
        chain = self.chain(tokens[: len(tokens) - 1]) if self.enabled else []
        common = {r: self._common(r, chain) for r in free}
        whole = [r for r in free if 0 < common[r] == len(self.keys[r])]
        row = max(whole, key=lambda r: (common[r], -r)) if whole else min(free)
        held = common[row]
        found, source = held, None
        for index in range(len(chain) - 1, held - 1, -1):  # the longest prefix any row holds
            if holders := self.holders.get(chain[index], set()) - {row}:
                found, source = index + 1, min(holders)
                break
        dropped = tuple(self.keys[row][held:])
        self.forget(row, held)
        self.adopt(row, chain[held:found])
        self.stats.queries += len(tokens)
        self.stats.hits += found * self.block_size
        return Place(row, found * self.block_size, source, held * self.block_size, dropped, tuple(chain))

    def adopt(self, row: int, keys: Sequence[bytes]) -> None:
        """The row holds these blocks next (copied in): findable."""
        for key in keys:
            self.keys[row].append(key)
            self.holders.setdefault(key, set()).add(row)

    def behind(self, row: int, count: int) -> bool:
        """Whether the row's first `count` positions hold a full block not yet findable."""
        return self.enabled and count // self.block_size > len(self.keys[row])

    def computed(self, row: int, tokens: Sequence[int]) -> None:
        """The row's cache holds `tokens` now: its full blocks are findable."""
        keys = self.keys[row]
        if not self.behind(row, len(tokens)):
            return
        for key in self.chain(tokens, len(keys), keys[-1] if keys else b""):
            keys.append(key)
            self.holders.setdefault(key, set()).add(row)

    def forget(self, row: int, keep: int = 0) -> None:
        """The row's blocks past its first `keep` no longer findable (the row is taken, or given back)."""
        for key in self.keys[row][keep:]:
            holders = self.holders[key]
            holders.discard(row)
            if not holders:
                del self.holders[key]
        del self.keys[row][keep:]
