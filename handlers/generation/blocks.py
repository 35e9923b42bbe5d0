"""The KV cache's blocks: who holds which, and the prefix cache over the full ones.

    pool = BlockPool(blocks=512, block_size=16)
    table, cached = pool.match(prompt)          # the prompt's longest cached prefix, shared
    table += pool.allocate(pool.needed(len(prompt), len(table)))   # None when too few are free
    pool.register(prompt[: computed], table)    # blocks the step filled, findable by their tokens
    pool.release(table)                         # the sequence ended (or was preempted)

A sequence's KV is in blocks of `block_size` positions, listed in its block table (position p is
in block table[p // block_size] at p % block_size); blocks are handed out as it grows. Block 0 is
never handed out: what a forward writes for padding goes there.

A full block is registered under a digest of its tokens and of every token before them (a chain:
each block's digest covers its parent's), so a later prompt that begins with the same tokens
finds its blocks and computes only the rest (prefix caching: a shared system prompt is computed
once). A block nobody holds stays findable until it is needed for another: evicted least recently
released first. Blocks with no digest are handed out lowest first: the pool's memory is touched
(made resident) only as far as the load needs (cache.py allocates it untouched).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import heapq
from collections.abc import Sequence

NULL_BLOCK = 0  # padding's writes land here; never in a table
DIGEST_BYTES = 16  # blake2b's: a collision between two prefixes is not a concern at 128 bits


def digest(parent: bytes, tokens: Sequence[int]) -> bytes:
    """A full block's key: its tokens after the prefix whose key is `parent`."""
    hasher = hashlib.blake2b(parent, digest_size=DIGEST_BYTES)
    hasher.update(b"".join(t.to_bytes(8, "little", signed=True) for t in tokens))
    return hasher.digest()


@dataclasses.dataclass
class PrefixStats:
    """Prompt tokens looked up in the prefix cache, and found (vLLM's prefix_cache_queries / hits)."""

    queries: int = 0
    hits: int = 0

    def count(self, queried: int, found: int) -> None:
        self.queries, self.hits = self.queries + queried, self.hits + found

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class BlockPool:
    def __init__(self, blocks: int, block_size: int, prefix_caching: bool = True):
        if blocks < 2:
            raise ValueError(f"a KV cache needs 2 blocks or more (one holds padding), got {blocks}")
        self.blocks, self.block_size, self.prefix_caching = blocks, block_size, prefix_caching
        self.free = list(range(1, blocks))  # a heap: held by nobody, holding nothing findable
        self.refs = [0] * blocks
        self.keys: list[bytes | None] = [None] * blocks
        self.by_key: dict[bytes, int] = {}
        self.evictable: collections.OrderedDict[int, None] = collections.OrderedDict()  # findable, held by nobody
        self.stats = PrefixStats()

    @property
    def available(self) -> int:
        """Blocks that can be handed out now (free, or findable but held by nobody)."""
        return len(self.free) + len(self.evictable)

    @property
    def used(self) -> int:
        """Blocks held by at least one sequence."""
        return self.blocks - 1 - self.available

    def needed(self, tokens: int, held: int) -> int:
        """Blocks more than `held` that `tokens` positions take."""
        return max(0, -(-tokens // self.block_size) - held)

    def allocate(self, count: int) -> list[int] | None:
        """`count` blocks for one holder, or None (nothing taken) when fewer are available."""
        if count > self.available:
            return None
        taken = []
        for _ in range(count):
            if self.free:
                block = heapq.heappop(self.free)
            else:
                block, _ = self.evictable.popitem(last=False)  # least recently released
                del self.by_key[self.keys[block]]
                self.keys[block] = None
            self.refs[block] = 1
            taken.append(block)
        return taken

    def release(self, table: Sequence[int]) -> None:
        """A holder lets go of its blocks: each is free once nobody holds it, findable still if full."""
        for block in reversed(table):  # the last ones evicted first: a later prompt reuses a prefix
            self.refs[block] -= 1
            if self.refs[block]:
                continue
            if self.keys[block] is None:
                heapq.heappush(self.free, block)
            else:
                self.evictable[block] = None

    def match(self, tokens: Sequence[int]) -> tuple[list[int], list[bytes]]:
        """The blocks holding `tokens`' longest cached prefix of full blocks, now held by the
        caller too, and their keys. At least one token is left out: its forward gives the logits.
        The caller counts what it used (stats.count): a match may be given back unused."""
        table: list[int] = []
        keys: list[bytes] = []
        if not self.prefix_caching:
            return table, keys
        parent = b""
        for index in range((len(tokens) - 1) // self.block_size):
            start = index * self.block_size
            parent = digest(parent, tokens[start : start + self.block_size])
            block = self.by_key.get(parent)
            if block is None:
                break
            if not self.refs[block]:
                del self.evictable[block]
            self.refs[block] += 1
            table.append(block)
            keys.append(parent)
        return table, keys

    def register(self, tokens: Sequence[int], table: Sequence[int], keys: list[bytes]) -> None:
        """Makes the full blocks of `table` that `tokens` (what the holder's cache holds) cover
        findable; `keys`, the holder's chain so far, grows to match. A block whose tokens another
        block already holds stays unfindable (it is freed when its holder ends)."""
        if not self.prefix_caching:
            return
        for index in range(len(keys), len(tokens) // self.block_size):
            start = index * self.block_size
            key = digest(keys[-1] if keys else b"", tokens[start : start + self.block_size])
            keys.append(key)
            block = table[index]
            if key not in self.by_key and self.keys[block] is None:
                self.by_key[key], self.keys[block] = block, key
