"""A step's forwards on a torch model over the slot cache (cache.py): decode rows, a prompt's part, or both at once.

    runner = Runner(model, cache, context=2048)
    logits = runner.decode(tokens=[17, 0, 5], positions=[40, 2048, 9])          # [rows, vocab]
    logits = runner.part(Part(slot=1, tokens=(5, 6, 7), start=32, last=True))    # [vocab]
    rows, part = runner.mixed([17, 0], [40, 2048], part)   # one forward; where attention.py allows it (`mixes`)
    rows, every = runner.mixed([17, 0], [40, 2048], draft, every=True)   # [rows, vocab], [len(draft.tokens), vocab]

A decode step has a row per slot up to the last one in use: row r feeds token r at position r of
slot r and attends over that slot's cache (a slot with nothing to decode writes at the cache's
scratch position, never read). A part computes a run of one sequence's tokens (a prompt, whole
or a chunk of it), each attending over the slot's cache before it and the part's tokens up to
it; its last token's logits, or (`every`: a draft to check, lookup.py) each of its tokens'. Where
the model's attention is transformers' pluggable kind (attention.py), decode rows and a
part are one forward (a mixed step): on CPU a decode step costs mostly the read of the weights,
which the part's forward makes anyway. Shapes are rounded so that the compiled forward sees few
of them: a decode step's span to a multiple of SPAN_STEP, a last part to a multiple of
PROMPT_STEP.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from handlers.generation import attention, native
from handlers.generation.cache import SlotCache
from handlers.itt import inference_range

# A decode step's attention span is rounded up to a multiple of this: the masked positions cost
# little (a cache read), and the span changes once in SPAN_STEP steps.
SPAN_STEP = 64
# A prompt is padded to a multiple of this. The forward is compiled for any length (dynamic
# shapes), so padding only has to keep out a length of 1, which a compiler specialises; each
# padded position costs a prefill a whole position's compute (64 here computed a 20-token
# prompt as 64).
PROMPT_STEP = 8
# A decode step computes at least this many rows (idle ones at the scratch position), where the
# cache has them: a size of 1 is one the compiler specialises, and each graph more is compiled at
# every start (Qwen2.5-0.5B's shape: ~40 s on 2 cores). The row kernels leave idle rows after the
# last sequence's uncomputed (decode, native.live_rows): two rows' tiles read slower than one's.
MIN_ROWS = 2
DECODE_KEEP = torch.tensor([0])  # a decode step feeds one token per row: its logits are all there are


def span(length: int, limit: int, step: int = SPAN_STEP) -> int:
    """length rounded up to the next multiple of step, at most limit."""
    return min(limit, -(-length // step) * step)


@dataclasses.dataclass(frozen=True)
class Part:
    """A run of a sequence's tokens from position `start` in its slot; `last`: its pending
    tokens' last run (padded; its last token's logits wanted)."""

    slot: int
    tokens: tuple[int, ...]
    start: int
    last: bool

    def length(self, context: int) -> int:
        """The positions its forward writes from `start`: its tokens, a last part's padded to a
        multiple of PROMPT_STEP within the context (fewer shapes to compile)."""
        take = len(self.tokens)
        return span(take, context - self.start, PROMPT_STEP) if self.last else take


class Runner:
    def __init__(self, model: nn.Module, cache: SlotCache, context: int, name: str = "", itt: bool = False):
        self.model, self.cache, self.context = model, cache, context
        self.name, self.itt = name, itt  # one ITT range per forward, for VTune
        self.mixes = attention.use(model)  # decode rows and a prompt's part in one forward
        # The kinds of step its forwards are (precompiled.step_kind): where the model mixes, a
        # part alone is a mixed step of idle rows.
        self.kinds = ("decode", "mixed") if self.mixes else ("decode", "part")

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor, **mixed):
        """Logits [rows, len(keep), vocab] at the positions `keep` of each row: the vocabulary
        projection (151936 columns for Qwen) is made only where a token is chosen. The cache's
        selection is the caller's."""
        with inference_range(self.name, ids.numel(), self.itt):
            out = self.model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=keep,
                **mixed,
            )
        return out.logits.float()

    def _rows(self, tokens: Sequence[int], positions: Sequence[int]):
        """ids and positions [rows, 1], and the mask [rows, 1, 1, kv] over each row's cache, kv the
        longest row's span (rows writing at the scratch position do not count)."""
        ids = torch.tensor(tokens, dtype=torch.long)[:, None]
        where = torch.tensor(positions, dtype=torch.long)[:, None]
        kv = span(max((p for p in positions if p < self.cache.scratch), default=0) + 1, self.context)
        mask = (torch.arange(kv)[None, :] <= where)[:, None, None, :]
        return ids, where, mask

    def _part(self, part: Part):
        """ids and positions [1, length] (only a last part padded), and the mask [1, 1, length, kv]
        over the slot's cache before them and the part."""
        take, length = len(part.tokens), part.length(self.context)
        ids = torch.zeros(1, length, dtype=torch.long)
        ids[0, :take] = torch.tensor(part.tokens, dtype=torch.long)
        positions = torch.arange(part.start, part.start + length)[None]
        mask = (torch.arange(part.start + length)[None, :] <= positions[0][:, None])[None, None]
        return ids, positions, mask

    def model_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """The positions the model is told: the scratch position is no position of the model's
        (GPT-2's learned positions end at the context); what it computes there is never read."""
        return positions.clamp(max=self.context - 1)

    def padded(self, tokens: Sequence[int], positions: Sequence[int]) -> tuple[list[int], list[int]]:
        """tokens and positions with idle rows (at the scratch position) up to MIN_ROWS."""
        idle = max(0, min(MIN_ROWS, self.cache.slots) - len(tokens))
        return [*tokens, *[0] * idle], [*positions, *[self.cache.scratch] * idle]

    def decode(self, tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Row r's next-token logits [rows, vocab], row r feeding tokens[r] at positions[r] of slot r
        (an idle row's, at the scratch position, are nobody's: the row kernels leave the products of
        those after the last sequence's row zero)."""
        tokens, positions = self.padded(tokens, positions)
        ids, where, mask = self._rows(tokens, positions)
        self.cache.select(slice(0, ids.shape[0]), where, mask.shape[-1])
        live = 1 + max((r for r, p in enumerate(positions) if p < self.cache.scratch), default=-1)
        with native.live_rows(live if live < len(positions) else 0):
            return self._forward(ids, self.model_positions(where), mask, DECODE_KEEP)[:, -1]

    def part(self, part: Part, every: bool = False) -> torch.Tensor:
        """The logits [vocab] at the part's last token (`every`: [tokens, vocab], each token's):
        where the model mixes, a mixed step of idle rows (the same graph as a mixed step's, none
        more to compile)."""
        if self.mixes:
            return self.mixed([], [], part, every)[1]
        ids, positions, mask = self._part(part)
        self.cache.select(slice(part.slot, part.slot + 1), positions, mask.shape[-1])
        take = len(part.tokens)
        logits = self._forward(ids, positions, mask, torch.arange(take) if every else torch.tensor([take - 1]))[0]
        return logits if every else logits[-1]

    def mixed(
        self, tokens: Sequence[int], positions: Sequence[int], part: Part, every: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """decode(tokens, positions) and part(part, every) in one forward: the decode rows and the
        part flattened into one row of tokens; attention.py splits its attention."""
        decode_ids, decode_positions, decode_mask = self._rows(*self.padded(tokens, positions))
        ids, part_positions, mask = self._part(part)
        rows = decode_ids.shape[0]
        slots = torch.cat([torch.arange(rows), torch.full((ids.shape[1],), part.slot)])[None]
        flat_positions = torch.cat([decode_positions.T, part_positions], 1)
        self.cache.select_tokens(slots, flat_positions, max(decode_mask.shape[-1], mask.shape[-1]))
        take = len(part.tokens)
        kept = rows + torch.arange(take) if every else torch.tensor([rows + take - 1])
        keep = torch.cat([torch.arange(rows), kept])
        mixed = attention.Mixed(decode_mask, mask, torch.tensor([part.slot]))
        ids = torch.cat([decode_ids.T, ids], 1)
        logits = self._forward(ids, self.model_positions(flat_positions), mask, keep, mixed=mixed)[0]
        return logits[:rows], (logits[rows:] if every else logits[rows])
