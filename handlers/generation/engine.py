"""Continuous batching: every sequence in flight advances one token per step; new ones join between steps.

    engine = Engine(model, decode=tokenizer.decode, eos={2}, slots=8, context=2048, dtype=torch.float32)
    sequence = engine.submit(Generation(prompt_ids, max_new_tokens=64, sampling=Sampling()), sink)
    engine.run_forever()           # in a thread of its own (handlers/text_generation.py)

A step admits waiting sequences into free slots, computes prompts ("prefill": a forward per
sequence, whose last position yields its first token), at most `prefill_chunk` prompt tokens a
step, then runs one forward over the slots whose prompts are done ("decode"): row r feeds slot r's
last token at its own position and attends over its own cache row. A prompt longer than what is
left of a step's chunk is computed over several steps, a part each, attending over the parts
before it: a long prompt delays the streams in flight by a chunk a step, not by its whole length
at once (chunked prefill; 0 computes each prompt whole as it is admitted). A sequence
leaves when it meets an end-of-sequence token, a stop string, its max_new_tokens or the context,
or is cancelled; its slot is free for the next step. The KV cache is allocated once
(cache.py), for `slots` sequences of `context` tokens.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import nn

from handlers.generation.cache import SlotCache
from handlers.generation.sampling import Sampling
from handlers.generation.stream import TextStream
from handlers.itt import inference_range

log = logging.getLogger(__name__)
# A decode step's attention span is rounded up to a multiple of this: the masked positions cost
# little (a cache read), and the span changes once in SPAN_STEP steps.
SPAN_STEP = 64
# A prompt is padded to a multiple of this. The forward is compiled for any length (dynamic
# shapes), so padding only has to keep out a length of 1, which a compiler specialises; each
# padded position costs a prefill a whole position's compute (64 here computed a 20-token
# prompt as 64).
PROMPT_STEP = 8
DECODE_KEEP = torch.tensor([0])  # a decode step feeds one token per row: its logits are all there are


class Finish(enum.StrEnum):
    """Why a sequence ended, in OpenAI's words (finish_reason)."""

    STOP = "stop"  # an end-of-sequence token or a stop string
    LENGTH = "length"  # max_new_tokens, or the context is full
    CANCELLED = "cancelled"  # the client went away, or the server stopped


class QueueFull(Exception):
    """Every slot is taken and the queue is at its limit: the client should retry later (a 503)."""


@dataclasses.dataclass(frozen=True)
class Generation:
    """What one request asks for: its prompt's token ids, checked, and how to continue it."""

    prompt: tuple[int, ...]
    max_new_tokens: int
    sampling: Sampling = Sampling()
    stop: tuple[str, ...] = ()
    # Generate max_new_tokens whatever comes (vLLM's and llama.cpp's option): a benchmark's
    # answers then have the same length on every server.
    ignore_eos: bool = False


class Sink(Protocol):
    """Where a sequence's text goes (the handler answers its client from these calls)."""

    def text(self, delta: str) -> None: ...

    def finish(self, reason: Finish, prompt_tokens: int, completion_tokens: int) -> None: ...


class Discard:
    """A sink for text nobody reads (the warm-up's)."""

    def text(self, delta: str) -> None:
        pass

    def finish(self, reason: Finish, prompt_tokens: int, completion_tokens: int) -> None:
        pass


@dataclasses.dataclass(eq=False)
class Running:
    """A request's sequence from submit to its end: waiting for a slot (slot -1), then in one."""

    generation: Generation
    sink: Sink
    stream: TextStream
    generator: torch.Generator | None
    slot: int = -1
    tokens: list[int] = dataclasses.field(default_factory=list)  # generated so far
    prefilled: int = 0  # prompt tokens in its cache row
    cancelled: bool = False
    submitted: float = dataclasses.field(default_factory=time.perf_counter)

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.generation.prompt)

    @property
    def position(self) -> int:
        """Where the last generated token goes in the cache (it is fed in the next decode)."""
        return len(self.generation.prompt) + len(self.tokens) - 1

    def cancel(self) -> None:
        self.cancelled = True  # read by the engine's thread at its next step


def span(length: int, limit: int, step: int = SPAN_STEP) -> int:
    """length rounded up to the next multiple of step, at most limit."""
    return min(limit, -(-length // step) * step)


class Engine:
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
    ):
        self.model, self.decode, self.eos = model, decode, frozenset(eos)
        self.name, self.itt = name, itt  # one ITT range per forward (prefill or decode step), for VTune
        self.slots, self.context, self.max_waiting = slots, context, max_waiting
        # Prompt tokens a step computes at most (a multiple of PROMPT_STEP: only a prompt's last
        # part is padded); 0: every admitted prompt whole.
        self.prefill_chunk = max(PROMPT_STEP, prefill_chunk // PROMPT_STEP * PROMPT_STEP) if prefill_chunk else 0
        self.cache = SlotCache(slots, context, dtype)
        self.active: dict[int, Running] = {}
        self.waiting: collections.deque[Running] = collections.deque()
        self.lock = threading.Condition()
        self.stopping = False

    # -- any thread --------------------------------------------------------------------------
    def submit(self, generation: Generation, sink: Sink) -> Running:
        sequence = Running(generation, sink, TextStream(self.decode, generation.stop), generation.sampling.generator())
        with self.lock:
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(
                    f"all {self.slots} sequences are generating and {len(self.waiting)} requests wait; retry later"
                )
            self.waiting.append(sequence)
            self.lock.notify()
        return sequence

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify()

    @property
    def busy(self) -> bool:
        return bool(self.active or self.waiting)

    # -- the engine's thread -----------------------------------------------------------------
    def run_forever(self, after_step: Callable[[], None] = lambda: None) -> None:
        while True:
            with self.lock:
                while not self.busy and not self.stopping:
                    self.lock.wait()
                if self.stopping:
                    break
            try:
                self.step()
                after_step()
            except Exception:  # noqa: BLE001 - the engine must outlive one bad step
                log.exception("generation step failed; its sequences are ended")
                for sequence in list(self.active.values()):
                    self._end(sequence, Finish.CANCELLED)
        for sequence in [*self.active.values(), *self.waiting]:
            self._end(sequence, Finish.CANCELLED)

    def step(self) -> None:
        """Admit what fits, compute prompts (a chunk's worth), then advance every sequence whose
        prompt is done by one token."""
        with torch.inference_mode():
            for sequence in list(self.active.values()):
                if sequence.cancelled:
                    self._end(sequence, Finish.CANCELLED)
            while len(self.active) < self.slots:
                with self.lock:
                    if not self.waiting:
                        break
                    sequence = self.waiting.popleft()
                if sequence.cancelled:
                    sequence.sink.finish(Finish.CANCELLED, len(sequence.generation.prompt), 0)
                    continue
                sequence.slot = min(set(range(self.slots)) - set(self.active))
                self.active[sequence.slot] = sequence
            self._prefill_prompts()
            if any(not sequence.prefilling for sequence in self.active.values()):
                self._decode()

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, rows: slice, keep: torch.Tensor
    ) -> torch.Tensor:
        """Logits [rows, len(keep), vocab] at the positions `keep` of each row: the vocabulary
        projection (151936 columns for Qwen) is made only where a token is chosen."""
        self.cache.select(rows, positions, mask.shape[-1])
        with inference_range(self.name, rows.stop - rows.start, self.itt):
            out = self.model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=keep,
            )
        return out.logits.float()

    def _prefill_prompts(self) -> None:
        """Prompts, in the order their sequences were admitted, up to the step's chunk of tokens;
        a sequence whose prompt is done gets its first token."""
        budget = self.prefill_chunk or sys.maxsize
        for sequence in [s for s in self.active.values() if s.prefilling]:
            remaining = len(sequence.generation.prompt) - sequence.prefilled
            take = remaining if remaining <= budget else budget // PROMPT_STEP * PROMPT_STEP
            if take <= 0:
                break
            logits = self._prefill(sequence, take)
            budget -= take
            if not sequence.prefilling:
                self._advance(sequence, logits)

    def _prefill(self, sequence: Running, take: int) -> torch.Tensor:
        """The prompt's next `take` tokens into the sequence's cache row, attending over its parts
        before them; the logits at the last of them (its first new token's, after the last part)."""
        prompt, start = sequence.generation.prompt, sequence.prefilled
        last = start + take == len(prompt)
        length = span(take, self.context - start, PROMPT_STEP) if last else take  # only the last part is padded
        ids = torch.zeros(1, length, dtype=torch.long)
        ids[0, :take] = torch.tensor(prompt[start : start + take])
        positions = torch.arange(start, start + length)[None]
        mask = (torch.arange(start + length)[None, :] <= positions[0][:, None])[None, None]  # [1, 1, length, kv]
        keep = torch.tensor([take - 1])
        logits = self._forward(ids, positions, mask, slice(sequence.slot, sequence.slot + 1), keep)[0, -1]
        sequence.prefilled = start + take
        return logits

    def _decode(self) -> None:
        rows = max(self.active) + 1
        ids = torch.zeros(rows, 1, dtype=torch.long)
        positions = torch.zeros(rows, 1, dtype=torch.long)
        for slot, sequence in self.active.items():
            if sequence.prefilling:
                # Its row writes at the position its prompt's next part overwrites; its logits unused.
                positions[slot, 0] = sequence.prefilled
            else:
                ids[slot, 0], positions[slot, 0] = sequence.tokens[-1], sequence.position
        kv_length = span(int(positions.max()) + 1, self.context)
        mask = (torch.arange(kv_length)[None, :] <= positions)[:, None, None, :]  # [rows, 1, 1, kv]
        logits = self._forward(ids, positions, mask, slice(0, rows), DECODE_KEEP)
        for slot, sequence in list(self.active.items()):
            if not sequence.prefilling:
                self._advance(sequence, logits[slot, -1])

    def _advance(self, sequence: Running, logits: torch.Tensor) -> None:
        """Choose the sequence's next token from its logits; send its text, or end it."""
        generation = sequence.generation
        token = generation.sampling.choose(logits, sequence.generator)
        if token in self.eos and not generation.ignore_eos:
            self._end(sequence, Finish.STOP)
            return
        sequence.tokens.append(token)
        delta = sequence.stream.push(token)
        if delta:
            sequence.sink.text(delta)
        if sequence.stream.stopped:
            self._end(sequence, Finish.STOP)
        elif len(sequence.tokens) >= generation.max_new_tokens or sequence.position >= self.context:
            self._end(sequence, Finish.LENGTH)

    def _end(self, sequence: Running, reason: Finish) -> None:
        self.active.pop(sequence.slot, None)
        if rest := sequence.stream.finish():
            sequence.sink.text(rest)
        sequence.sink.finish(reason, len(sequence.generation.prompt), len(sequence.tokens))
