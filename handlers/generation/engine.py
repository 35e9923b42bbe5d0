"""Continuous batching on a torch model: every sequence in flight advances a token a step; new ones join between steps.

    engine = Engine(model, decode=tokenizer.decode, eos={2}, slots=16, context=2048, dtype=torch.float32,
                    prefill_chunk=128, kv_positions=4 * 2048)
    sequence = engine.submit(Generation(prompt_ids, max_new_tokens=64, sampling=Sampling()), sink, key="r1")
    engine.run_forever()           # in a thread of its own (handlers/text_generation.py)
    engine.cancel("r1")            # the client went away: its slot is free at the next step

A waiting sequence is admitted into a free slot (`slots`: the most sequences a step computes),
one whose cache row holds the beginning of its prompt, else the lowest (prefix.py): it computes
only the rest (prefix caching; blocks another slot holds are copied in). A step computes a
prompt, at most `prefill_chunk` tokens of it while sequences decode (a longer prompt takes
several steps, a part each: chunked prefill, so a long prompt delays the streams in flight by a
chunk a step, not by its whole length; 0 computes each prompt whole; a step with no sequence
decoding computes its first prompt whole, as nobody else waits on it), and advances every
sequence whose prompt is done by one token, in one forward with the prompt's part where the
model allows it (runner.py: a mixed step; where it does not, the chunk is shared by the prompts
waiting, each part a forward of its own). A
sequence leaves at an end-of-sequence token, a stop string, its max_new_tokens or the context's
end, or when cancelled; its slot is free for the next step, and what its row holds stays
findable until the slot is taken again or its room is needed (with a prefix store, a taken row's
blocks are kept beside the rows: prefix_store.py).

The rows together hold at most `kv_positions` (the memory plan's contexts x the context: fewer
than a context a slot where memory is short; kv_budget.py counts what they hold). A sequence
is admitted when its text fits beside those in flight, finished rows given back to make room,
least recently used first. When the sequences in flight outgrow it, the youngest is preempted:
its row given back, it waits first in the queue and is computed again from its prompt and the
tokens it has, and goes on as it would have (vLLM's recompute).
"""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Callable, Sequence

import torch
from torch import nn

from handlers.generation.cache import KvShape, SlotCache
from handlers.generation.kv_budget import KvBudget
from handlers.generation.lookup import PAUSE_MOST, guess
from handlers.generation.precompiled import Forward
from handlers.generation.prefix import Place, PrefixCache
from handlers.generation.prefix_store import PrefixStore
from handlers.generation.runner import PROMPT_STEP, Part, Runner
from handlers.generation.scheduler import Running, Scheduler

log = logging.getLogger(__name__)
BLOCK_SIZE = 16  # tokens per prefix-cache block: vLLM's


def prompt_chunk(asked: int) -> int:
    """Prompt tokens a step computes at most: a multiple of PROMPT_STEP, so that only a prompt's
    last part is padded; 0 (every admitted prompt whole) stays 0."""
    return max(PROMPT_STEP, asked // PROMPT_STEP * PROMPT_STEP) if asked else 0


class Engine(Scheduler):
    """The steps computed by a torch model (eager or compiled) on the kit's KV cache."""

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
        block_size: int = BLOCK_SIZE,
        prefix_caching: bool = True,
        lookup: int = 0,
        kv_positions: int | None = None,
        kv_int8: bool = False,
        prefix_store_bytes: int = 0,
    ):
        super().__init__(decode, eos, slots, context, max_waiting, name)
        if kv_positions is not None and kv_positions < context:
            raise ValueError(
                f"the KV cache's budget of {kv_positions} positions holds less than one context ({context})"
            )
        self.prefill_chunk = prompt_chunk(prefill_chunk)
        self.prefix = PrefixCache(slots, block_size, prefix_caching)
        self.cache = SlotCache(KvShape.of(model.config), slots, context, dtype, kv_int8)
        # What taken rows held, up to `prefix_store_bytes` within the budget (prefix_store.py).
        self.store = PrefixStore()
        self.block_bytes = self.cache.shape.token_bytes(dtype, kv_int8) * block_size
        self.store_blocks = prefix_store_bytes // self.block_bytes if prefix_caching else 0
        # What the cache may hold resident (the memory plan's); None: every row a whole context.
        self.budget = KvBudget(slots, kv_positions or slots * context, stored=lambda: len(self.store) * block_size)
        self.runner = Runner(model, self.cache, context, name, itt)
        self.model = model
        self.lookup = lookup  # draft tokens a step checks (prompt lookup, lookup.py); 0: none

    @property
    def mixes(self) -> bool:
        """Decode rows and a prompt's part in one forward (runner.py)."""
        return self.runner.mixes

    @property
    def prefix_caching(self) -> bool:
        return self.prefix.enabled

    @property
    def compiles_at_first_steps(self) -> bool:
        """A compiled forward traces where a kind of step was not loaded whole, or a step's shapes
        failed a loaded graph's guards; an eager forward compiles nothing."""
        forward = self.model.forward
        return isinstance(forward, Forward) and forward.traces(self.runner.kinds)

    @property
    def cache_bytes(self) -> int:
        """What the cache may hold resident: the budget's positions (it maps more, untouched)."""
        return self.budget.positions * self.cache.shape.token_bytes(self.cache.dtype, self.cache.int8)

    def prefix_store_bytes(self) -> int:
        return len(self.store) * self.block_bytes

    def kv_cache_usage(self) -> float:
        """The budget's share held by the rows of sequences in flight (a finished sequence's
        row is room: it is given back when needed)."""
        return sum(self.budget.held[slot] for slot in list(self.active)) / self.budget.positions

    def step(self) -> None:
        """Admit what fits, compute prompts (a chunk's worth), and advance every sequence whose
        prompt is done by one token: in one forward with the first prompt's part where the model
        allows it, else in a decode forward after the prompts."""
        with torch.inference_mode():
            self._admit()
            while True:  # until what the step writes fits in the budget, preempting the youngest
                parts = self._prompt_parts()
                decoding = [s for s in self.active.values() if not s.prefilling]
                drafted = None if parts else self._drafted(decoding)
                if self._make_room(self._written(parts, decoding, drafted)):
                    break
                self._preempt(list(self.active.values())[-1])
            if drafted:
                self._check(decoding, *drafted)
                return
            if parts and decoding and self.mixes:
                sequence, part = parts.pop(0)
                rows, part_logits = self.runner.mixed(*self._decode_rows(), part)
                self._computed(sequence, len(part.tokens), part_logits)
                self._computed_rows(decoding, rows)
                decoding = []
            for sequence, part in parts:
                self._computed(sequence, len(part.tokens), self.runner.part(part))
            if decoding:
                self._computed_rows(decoding, self.runner.decode(*self._decode_rows()))

    # -- the KV cache's budget (kv_budget.py) ------------------------------------------------------
    def _room_for(self, sequence: Running) -> bool:
        return self.budget.room_for(len(sequence.known), self.active)

    def _written(
        self,
        parts: list[tuple[Running, Part]],
        decoding: list[Running],
        drafted: tuple[Running, tuple[int, ...]] | None,
    ) -> dict[int, int]:
        """Each row's positions once the step has written: a decoding sequence's next, a prompt's
        part (a last one's padding too: its pages are written), a draft and the token before it."""
        written = {s.slot: s.computed + 1 for s in decoding}
        written.update({s.slot: part.start + part.length(self.context) for s, part in parts})
        if drafted:
            sequence, draft = drafted
            written[sequence.slot] = sequence.computed + 1 + len(draft)
        return written

    def _make_room(self, written: dict[int, int]) -> bool:
        """Rows of finished sequences given back, least recently used first, until `written` fits;
        False when it does not with all of them given back."""
        while not self.budget.fits(written):
            if self.store.evict():  # the store's blocks before any row's
                continue
            row = self.budget.coldest(set(range(self.slots)) - set(self.active) - set(written))
            if row is None:
                return False
            self._give_back(row)
        self.budget.hold(written)
        return True

    def _give_back(self, row: int) -> None:
        self.prefix.forget(row)
        self.cache.release(row)
        self.budget.release(row)

    def _preempt(self, sequence: Running) -> None:
        """The sequence's row given back and the sequence queued first, to be computed again from
        its prompt and the tokens it has: the same answer, later (a token chosen at random was
        drawn and stays)."""
        if len(self.active) == 1:
            raise RuntimeError(f"the KV cache's budget of {self.budget.positions} positions holds no sequence")
        row = sequence.slot
        log.info(
            "%s: request %s preempted at %d token(s): the KV cache's %d positions are in use; computed again later",
            self.name,
            sequence.key or "-",
            len(sequence.known),
            self.budget.positions,
        )
        self._requeue(sequence)
        self._give_back(row)

    # -- prompt lookup ----------------------------------------------------------------------------
    def _drafted(self, decoding: list[Running]) -> tuple[Running, tuple[int, ...]] | None:
        """The first decoding sequence whose text gives a draft, and the draft: one a step, checked
        in the step's forward (a part of the mixed step), or alone where the model does not mix."""
        if not self.lookup or not decoding or (len(decoding) > 1 and not self.mixes):
            return None
        for sequence in decoding:
            room = min(
                self.lookup,
                sequence.generation.max_new_tokens - len(sequence.tokens) - 1,
                self.context - sequence.position - 2,
            )
            if room > 0 and len(sequence.tokens) >= sequence.draft_at and (draft := guess(sequence.known, room)):
                return sequence, draft
        return None

    def _check(self, decoding: list[Running], sequence: Running, draft: tuple[int, ...]) -> None:
        """The sequence's last token and its draft in one part, the others' rows beside it: each
        drafted token is kept while it is the token the sequence chooses from the logits before it
        (lookup.py), then the chosen one; the cache rows past the kept ones are written over later."""
        part = Part(sequence.slot, (sequence.token_at(sequence.computed), *draft), sequence.computed, last=False)
        others = [s for s in decoding if s is not sequence]
        if others:
            rows, logits = self.runner.mixed(*self._decode_rows(skip=sequence), part, every=True)
            self._computed_rows(others, rows)
        else:
            logits = self.runner.part(part, every=True)
        kept = 0
        for index in range(len(draft) + 1):
            self._computed(sequence, 1, logits[index])
            if self.active.get(sequence.slot) is not sequence or index == len(draft):
                break  # it ended, or every drafted token was kept and the next chosen
            if sequence.tokens[-1] != draft[index]:
                break
            kept += 1
        self._drafts_kept(sequence, len(draft), kept)

    def _drafts_kept(self, sequence: Running, drafted: int, kept: int) -> None:
        """Counted for its usage and the log; after a draft wholly refused, the sequence drafts
        again only after 2, 4, ... PAUSE_MOST tokens: a draft costs its tokens' compute, and text
        that repeats nothing (free text) must not pay it every step."""
        sequence.drafted += drafted
        sequence.kept += kept
        self.metrics.drafted(drafted, kept)
        sequence.refusals = 0 if kept else sequence.refusals + 1
        if sequence.refusals:
            sequence.draft_at = len(sequence.tokens) + min(2**sequence.refusals, PAUSE_MOST)

    def _place(self, sequence: Running) -> int | None:
        """The free slot prefix.py picks; what another row holds of the sequence's text copied in."""
        free = set(range(self.slots)) - set(self.active)
        place = self.prefix.place(sequence.known, free)
        self._keep(place)
        found = place.found
        if place.source is not None:
            # Room made before the copy, never by giving back the row copied from (kept as it is).
            if self._make_room({place.row: place.found, place.source: self.budget.held[place.source]}):
                self.cache.copy(place.source, place.row, slice(place.held, place.found))
            else:  # no room beside it: those blocks are computed, not copied
                self.prefix.forget(place.row, place.held // self.prefix.block_size)
                self.prefix.stats.hits -= place.found - place.held
                found = place.held
        found = self._restore(place, found)
        self.budget.hold({place.row: found})
        sequence.computed = found
        return place.row

    def _keep(self, place: Place) -> None:
        """The blocks the taken row held that no other row holds, into the prefix store while the
        budget has room beside what is held (they are still in the row: nothing is written yet)."""
        size = self.prefix.block_size
        for index, key in enumerate(place.dropped, start=place.held // size):
            if key in self.store or key in self.prefix.holders:
                continue
            if len(self.store) >= self.store_blocks or not self.budget.room(size):
                break
            self.store.keep(key, self.cache.block(place.row, slice(index * size, (index + 1) * size)))

    def _restore(self, place: Place, found: int) -> int:
        """The prompt's blocks after the first `found` positions that the store kept, copied into
        the row while they follow one another; the positions the row holds of the prompt then."""
        size = self.prefix.block_size
        if not self.store:
            return found
        keys = list(itertools.takewhile(lambda key: key in self.store, place.chain[found // size :]))
        if not keys:
            return found
        saved = [self.store.take(key) for key in keys]  # out of the store, into the row
        if not self._make_room({place.row: found + len(keys) * size}):
            return found  # no room for them: computed instead
        for index, blocks in enumerate(saved, start=found // size):
            self.cache.put_block(place.row, slice(index * size, (index + 1) * size), blocks)
        self.prefix.adopt(place.row, keys)
        self.prefix.stats.hits += len(keys) * size
        return found + len(keys) * size

    # -- what a step computes ---------------------------------------------------------------------
    def _decode_rows(self, skip: Running | None = None) -> tuple[list[int], list[int]]:
        """A token and a position per slot up to the last one taken: a decoding sequence's next,
        else the cache's scratch position (a prompt's slot too, and `skip`'s: a part has rows of
        its own)."""
        rows = max(self.active) + 1
        tokens, positions = [0] * rows, [self.cache.scratch] * rows
        for slot, sequence in self.active.items():
            if not sequence.prefilling and sequence is not skip:
                tokens[slot], positions[slot] = sequence.token_at(sequence.computed), sequence.computed
        return tokens, positions

    def _prompt_parts(self) -> list[tuple[Running, Part]]:
        """The prompt tokens this step computes, in the order the sequences were admitted, up to
        the step's chunk."""
        budget, parts = self.prefill_chunk or sys.maxsize, []
        alone = all(sequence.prefilling for sequence in self.active.values())  # no stream waits on the step
        for sequence in self.active.values():  # in the order they were admitted (a dict's)
            if not sequence.prefilling:
                continue
            if parts and self.mixes:
                # A step mixes one part into its forward; a second would be a forward of its own,
                # reading every weight again for no decode row, where the next step computes it
                # beside the decode rows for its tokens' compute alone. Served at 16 streams
                # (Qwen2.5-0.5B's shape, bf16, 2-core AMX Xeon, 3 interleaved rounds): 71-76 ->
                # 78-81 output tokens/s.
                break
            whole = sequence.pending <= budget or (alone and not parts)
            take = sequence.pending if whole else budget // PROMPT_STEP * PROMPT_STEP
            if take <= 0:
                break
            start = sequence.computed
            tokens = sequence.known[start : start + take]
            parts.append((sequence, Part(sequence.slot, tokens, start, take == sequence.pending)))
            budget -= take
        return parts

    def _computed_rows(self, decoding: list[Running], logits: torch.Tensor) -> None:
        for sequence in decoding:
            self._computed(sequence, 1, logits[sequence.slot])

    def _computed(self, sequence: Running, count: int, logits: torch.Tensor) -> None:
        """`count` more of the sequence's tokens are in its cache row: its full blocks findable,
        and its next token chosen from `logits` when they were the last pending."""
        sequence.computed += count
        if self.prefix.behind(sequence.slot, sequence.computed):
            self.prefix.computed(sequence.slot, sequence.known[: sequence.computed])
        if not sequence.pending:
            generation, matcher = sequence.generation, sequence.matcher
            allowed = logits if matcher is None else matcher.masked(logits)
            token = generation.sampling.choose(allowed, sequence.generator, generation.prompt, sequence.tokens)
            if matcher is not None:
                matcher.accept(token)
            self._accept(sequence, token, logits)
