"""A step's forwards on a torch model over the paged cache (cache.py): decode rows, a prompt's part, or both at once.

    runner = Runner(model, cache, block_size=16, context=2048)
    logits = runner.decode([Row(token=17, position=40, table=[3, 9, 12])])      # [rows, vocab]
    logits = runner.part(Part(tokens=(5, 6, 7), start=32, table=[3, 9, 12], last=True))   # [vocab]
    rows, part = runner.mixed(rows_, part_)      # one forward; where attention.py allows it (`mixes`)

A decode row feeds one token of a sequence at its position and attends over its cache; a part
computes a run of a sequence's tokens (a prompt, whole or a chunk of it), each attending over
the cache before it and the part's tokens up to it. Where the model's attention is
transformers' pluggable kind (attention.py), decode rows and a part are one forward (a mixed
step): on CPU a decode step costs mostly the read of the weights, which the part's forward makes
anyway. Shapes are rounded so that the compiled forward sees few of them: a decode step's span
to a multiple of SPAN_STEP, a last part to a multiple of PROMPT_STEP (its padding writes to the
cache's null block and is never read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from handlers.generation import attention
from handlers.generation.blocks import NULL_BLOCK
from handlers.generation.cache import PagedCache
from handlers.itt import inference_range

# A decode step's attention span is rounded up to a multiple of this: the masked positions cost
# little (a cache read), and the span changes once in SPAN_STEP steps.
SPAN_STEP = 64
# A prompt is padded to a multiple of this. The forward is compiled for any length (dynamic
# shapes), so padding only has to keep out a length of 1, which a compiler specialises; each
# padded position costs a prefill a whole position's compute (64 here computed a 20-token
# prompt as 64).
PROMPT_STEP = 8
DECODE_KEEP = torch.tensor([0])  # a decode step feeds one token per row: its logits are all there are


def span(length: int, limit: int, step: int = SPAN_STEP) -> int:
    """length rounded up to the next multiple of step, at most limit."""
    return min(limit, -(-length // step) * step)


@dataclasses.dataclass(frozen=True)
class Row:
    """One token of a sequence, fed at its position."""

    token: int
    position: int
    table: Sequence[int]


@dataclasses.dataclass(frozen=True)
class Part:
    """A run of a sequence's tokens from position `start`; `last`: its pending tokens' last run
    (padded; its last token's logits wanted)."""

    tokens: tuple[int, ...]
    start: int
    table: Sequence[int]
    last: bool


class Runner:
    def __init__(
        self, model: nn.Module, cache: PagedCache, block_size: int, context: int, name: str = "", itt: bool = False
    ):
        self.model, self.cache, self.block_size, self.context = model, cache, block_size, context
        self.name, self.itt = name, itt  # one ITT range per forward, for VTune
        self.mixes = attention.use(model)  # decode rows and a prompt's part in one forward

    def slots(self, tables: Sequence[Sequence[int]], positions: torch.Tensor) -> torch.Tensor:
        """The cache slot of each position [rows, n] of row r's sequence (its block table
        tables[r]); a position past its blocks gets the null block's first slot."""
        blocks = max(len(t) for t in tables)
        table = torch.full((len(tables), blocks + 1), NULL_BLOCK, dtype=torch.long)
        for row, blocks_of in enumerate(tables):
            table[row, : len(blocks_of)] = torch.tensor(blocks_of, dtype=torch.long)
        index = (positions // self.block_size).clamp(max=blocks)
        block = table.gather(1, index)
        return torch.where(block == NULL_BLOCK, NULL_BLOCK, block * self.block_size + positions % self.block_size)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor, **mixed):
        """Logits [rows, len(keep), vocab] at the positions `keep` of each row: the vocabulary
        projection (151936 columns for Qwen) is made only where a token is chosen."""
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

    # -- the inputs of each kind of forward ---------------------------------------------------
    def _rows(self, rows: Sequence[Row]):
        """ids and positions [rows, 1], the mask [rows, 1, 1, kv], write slots [rows], read [rows, kv]."""
        ids = torch.tensor([[r.token] for r in rows], dtype=torch.long)
        positions = torch.tensor([[r.position] for r in rows], dtype=torch.long)
        kv = span(int(positions.max()) + 1, self.context)
        tables = [r.table for r in rows]
        write = self.slots(tables, positions)[:, 0]
        read = self.slots(tables, torch.arange(kv).expand(len(rows), kv))
        mask = (torch.arange(kv)[None, :] <= positions)[:, None, None, :]
        return ids, positions, mask, write, read

    def _part(self, part: Part):
        """ids and positions [1, length], the mask [1, 1, length, kv] over the cache before them
        and the part, write slots [length] (padding's: the null block's), read [1, kv]."""
        take = len(part.tokens)
        length = span(take, self.context - part.start, PROMPT_STEP) if part.last else take
        ids = torch.zeros(1, length, dtype=torch.long)
        ids[0, :take] = torch.tensor(part.tokens, dtype=torch.long)
        positions = torch.arange(part.start, part.start + length)[None]
        kv = part.start + length
        mask = (torch.arange(kv)[None, :] <= positions[0][:, None])[None, None]
        write = self.slots([part.table], positions)[0]
        write[take:] = NULL_BLOCK
        read = self.slots([part.table], torch.arange(kv)[None])
        return ids, positions, mask, write, read

    # -- forwards --------------------------------------------------------------------------
    def decode(self, rows: Sequence[Row]) -> torch.Tensor:
        """Each row's next-token logits [rows, vocab]."""
        ids, positions, mask, write, read = self._rows(rows)
        self.cache.select(write, read)
        return self._forward(ids, positions, mask, DECODE_KEEP)[:, -1]

    def part(self, part: Part) -> torch.Tensor:
        """The logits [vocab] at the part's last token."""
        ids, positions, mask, write, read = self._part(part)
        self.cache.select(write, read)
        return self._forward(ids, positions, mask, torch.tensor([len(part.tokens) - 1]))[0, -1]

    def mixed(self, rows: Sequence[Row], part: Part) -> tuple[torch.Tensor, torch.Tensor]:
        """decode(rows) and part(part) in one forward: the decode rows and the part flattened into
        one row of tokens; attention.py splits its attention."""
        decode_ids, decode_positions, decode_mask, decode_write, decode_read = self._rows(rows)
        ids, positions, mask, write, read = self._part(part)
        count, kv = len(rows), max(decode_read.shape[1], read.shape[1])
        reads = torch.full((count + 1, kv), NULL_BLOCK, dtype=torch.long)
        reads[:count, : decode_read.shape[1]], reads[count, : read.shape[1]] = decode_read, read[0]
        self.cache.select(torch.cat([decode_write, write]), reads)
        keep = torch.cat([torch.arange(count), torch.tensor([count + len(part.tokens) - 1])])
        logits = self._forward(
            torch.cat([decode_ids.T, ids], 1),
            torch.cat([decode_positions.T, positions], 1),
            mask,
            keep,
            mixed=attention.Mixed(decode_mask, mask),
        )[0]
        return logits[:count], logits[count]
