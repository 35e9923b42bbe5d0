"""Continuous batching on a torch model: every sequence in flight advances a token a step; new ones join between steps.

    engine = Engine(model, decode=tokenizer.decode, eos={2}, slots=16, context=2048, dtype=torch.float32,
                    prefill_chunk=128)
    sequence = engine.submit(Generation(prompt_ids, max_new_tokens=64, sampling=Sampling()), sink, key="r1")
    engine.run_forever()           # in a thread of its own (handlers/text_generation.py)
    engine.cancel("r1")            # the client went away: its blocks are free at the next step

The KV cache is paged (blocks.py, cache.py): `kv_tokens` positions in blocks of `block_size`,
handed out as sequences grow. A waiting sequence is admitted when a slot is free (`slots`: the
most sequences a step computes) and the cache has blocks for its text; a prompt whose first
blocks another prompt left in the cache (a shared system prompt) takes those and computes only
the rest (prefix caching). A step computes prompts, at most `prefill_chunk` tokens of them (a
longer prompt takes several steps, a part each: chunked prefill, so a long prompt delays the
streams in flight by a chunk a step, not by its whole length; 0 computes each prompt whole), and
advances every sequence whose prompt is done by one token, in one forward with the first prompt
part where the model allows it (runner.py). When a sequence needs a block and none is left, the
youngest sequence is preempted: its blocks are released and it waits, first in line, to compute
its prompt and the tokens it has sent again (they are in the prefix cache unless evicted) and go
on where it was. The answers are the same; no request fails for want of cache.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Sequence

import torch
from torch import nn

from handlers.generation.blocks import BlockPool
from handlers.generation.cache import KvShape, PagedCache
from handlers.generation.runner import PROMPT_STEP, Part, Row, Runner
from handlers.generation.scheduler import Finish, Running, Scheduler

log = logging.getLogger(__name__)
BLOCK_SIZE = 16  # positions per cache block: vLLM's; the prefix cache's unit


def prompt_chunk(asked: int) -> int:
    """Prompt tokens a step computes at most: a multiple of PROMPT_STEP, so that only a prompt's
    last part is padded; 0 (every admitted prompt whole) stays 0."""
    return max(PROMPT_STEP, asked // PROMPT_STEP * PROMPT_STEP) if asked else 0


def pool_blocks(kv_tokens: int, context: int, block_size: int) -> int:
    """Blocks for `kv_tokens` positions, never fewer than one whole context (a sequence alone
    always fits), and the null block."""
    return 1 + math.ceil(max(kv_tokens, context) / block_size)


class Engine(Scheduler):
    """The steps computed by a torch model (eager or compiled) on the kit's paged KV cache."""

    def __init__(
        self,
        model: nn.Module,
        decode: Callable[[Sequence[int]], str],
        eos: set[int],
        slots: int,
        context: int,
        dtype: torch.dtype,
        max_waiting: int = 64,
        name: str = "",
        itt: bool = False,
        prefill_chunk: int = 0,
        kv_tokens: int = 0,
        block_size: int = BLOCK_SIZE,
        prefix_caching: bool = True,
    ):
        """`kv_tokens`: the cache's positions (0: `slots` whole contexts)."""
        super().__init__(decode, eos, slots, context, max_waiting, name)
        self.prefill_chunk = prompt_chunk(prefill_chunk)
        blocks = pool_blocks(kv_tokens or slots * context, context, block_size)
        self.pool = BlockPool(blocks, block_size, prefix_caching)
        self.cache = PagedCache(KvShape.of(model.config), blocks, block_size, dtype)
        self.runner = Runner(model, self.cache, block_size, context, name, itt)
        self.model, self.mixes = model, self.runner.mixes
        self.preemptions = 0

    @property
    def cache_bytes(self) -> int:
        return self.cache.bytes

    def step(self) -> None:
        """Admit what fits, compute prompts (a chunk's worth), and advance every sequence whose
        prompt is done by one token: in one forward with the first prompt's part where the model
        allows it, else in a decode forward after the prompts."""
        with torch.inference_mode():
            self._admit()
            rows = self._decoding()
            parts = self._prompt_parts()
            if parts and rows and self.mixes:
                sequence, part = parts.pop(0)
                row_logits, part_logits = self.runner.mixed([self._row(s) for s in rows], part)
                self._computed(sequence, len(part.tokens), part_logits)
                self._computed_rows(rows, row_logits)
                rows = []
            for sequence, part in parts:
                self._computed(sequence, len(part.tokens), self.runner.part(part))
            if rows:
                self._computed_rows(rows, self.runner.decode([self._row(s) for s in rows]))

    # -- admission, growth and preemption -------------------------------------------------------
    def _place(self, sequence: Running) -> bool:
        """Blocks for the sequence's whole text (its first ones from the prefix cache when there)."""
        known = sequence.known
        table, keys = self.pool.match(known)
        more = self.pool.allocate(self.pool.needed(len(known), len(table)))
        if more is None:
            self.pool.release(table)
            return False
        self.pool.stats.count(len(known), len(table) * self.pool.block_size)
        sequence.table, sequence.keys, sequence.computed = table + more, keys, len(table) * self.pool.block_size
        return True

    def _decoding(self) -> list[Running]:
        """The sequences that feed one token this step (oldest first), each with a block for it."""
        rows = []
        for sequence in sorted(self.active.values(), key=lambda s: s.admitted):
            if sequence.slot >= 0 and not sequence.prefilling and self._grow(sequence):
                rows.append(sequence)
        return rows

    def _grow(self, sequence: Running) -> bool:
        """A block for the sequence's next position when it needs one: when none is left, the
        youngest sequences are preempted until there is; False when that was this one."""
        need = self.pool.needed(sequence.computed + 1, len(sequence.table))
        while need:
            more = self.pool.allocate(need)
            if more is not None:
                sequence.table += more
                return True
            youngest = max(self.active.values(), key=lambda s: s.admitted)
            self._preempt(youngest)
            if youngest is sequence:
                return False
        return True

    def _preempt(self, sequence: Running) -> None:
        """Frees the sequence's blocks; it waits first in line to compute its text again."""
        self.active.pop(sequence.slot)
        self.pool.release(sequence.table)
        sequence.slot, sequence.table, sequence.keys, sequence.computed = -1, [], [], 0
        with self.lock:
            self.waiting.appendleft(sequence)
        self.preemptions += 1
        log.info(
            "%s: preempted a sequence of %d tokens (the cache is full: %d blocks); %d generating",
            self.name,
            len(sequence.known),
            self.pool.blocks,
            len(self.active),
        )

    def _end(self, sequence: Running, reason: Finish) -> None:
        self.pool.release(sequence.table)
        sequence.table = []
        super()._end(sequence, reason)

    # -- what a step computes ---------------------------------------------------------------------
    def _row(self, sequence: Running) -> Row:
        return Row(sequence.token_at(sequence.computed), sequence.computed, sequence.table)

    def _prompt_parts(self) -> list[tuple[Running, Part]]:
        """The prompt tokens this step computes, in the order the sequences were admitted, up to
        the step's chunk."""
        budget, parts = self.prefill_chunk or sys.maxsize, []
        for sequence in sorted(self.active.values(), key=lambda s: s.admitted):
            if not sequence.prefilling:
                continue
            take = sequence.pending if sequence.pending <= budget else budget // PROMPT_STEP * PROMPT_STEP
            if take <= 0:
                break
            start = sequence.computed
            tokens = sequence.known[start : start + take]
            parts.append((sequence, Part(tokens, start, sequence.table, take == sequence.pending)))
            budget -= take
        return parts

    def _computed_rows(self, rows: list[Running], logits: torch.Tensor) -> None:
        for index, sequence in enumerate(rows):
            self._computed(sequence, 1, logits[index])

    def _computed(self, sequence: Running, count: int, logits: torch.Tensor) -> None:
        """`count` more of the sequence's tokens are in its cache: its full blocks findable, and
        its next token chosen from `logits` when they were the last pending."""
        sequence.computed += count
        if sequence.computed // self.pool.block_size > len(sequence.keys):
            self.pool.register(sequence.known[: sequence.computed], sequence.table, sequence.keys)
        if not sequence.pending:
            self._accept(sequence, sequence.generation.sampling.choose(logits, sequence.generator))
