"""Blocks a taken row held, kept beside the rows: more prefixes findable than there are rows.

    store = PrefixStore()
    store.keep(key, saved)     # a full block's keys and values (SlotCache.block) as its row is taken
    store.take(key)            # the block's tensors, out of the store (into a row); None if not kept
    store.evict()              # the least recently kept block dropped; False when it holds none
    len(store)                 # blocks held: the KV budget counts their positions (engine.py)

The cache has a row per sequence computed at once (cache.py), and what a finished sequence's row
holds is found again only until another sequence takes the row (prefix.py). A chat server with
more conversations than rows would compute each returning conversation whole; vLLM and llama.cpp
keep blocks beyond their running sequences. Here a taken row's blocks that no other row holds are
copied out first (a block of 16 positions of Qwen2.5-0.5B's shape in bf16 is 192 KiB), within the
memory plan's KV budget, and copied back into the row of a prompt that begins with them. Under
pressure for room they go first, before any row's (engine.py).
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class PrefixStore:
    def __init__(self) -> None:
        self._blocks: OrderedDict[bytes, tuple[torch.Tensor, ...]] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    def keep(self, key: bytes, saved: tuple[torch.Tensor, ...]) -> None:
        self._blocks[key] = saved
        self._blocks.move_to_end(key)

    def take(self, key: bytes) -> tuple[torch.Tensor, ...] | None:
        return self._blocks.pop(key, None)

    def evict(self) -> bool:
        if not self._blocks:
            return False
        self._blocks.popitem(last=False)
        return True
