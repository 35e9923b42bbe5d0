"""Continuous batching: every sequence in flight advances one token per step; new ones join between steps.

    engine = Engine(model, decode=tokenizer.decode, eos={2}, slots=8, context=2048, dtype=torch.float32)
    sequence = engine.submit(Generation(prompt_ids, max_new_tokens=64, sampling=Sampling()), sink, key="r1")
    engine.run_forever()           # in a thread of its own (handlers/text_generation.py)
    engine.cancel("r1")            # the client went away: its slot is free at the next step

A step admits waiting sequences into free slots, computes prompts ("prefill": a forward per
sequence, whose last position yields its first token), at most `prefill_chunk` prompt tokens a
step, and advances the sequences whose prompts are done by one token ("decode": row r feeds slot
r's last token at its own position and attends over its own cache row). Where the model's
attention is transformers' pluggable kind (attention.py), the first prompt's part and the decode
rows are one forward (a mixed step): on CPU a decode step costs mostly the read of the weights,
which the prompt's forward makes anyway. A prompt longer than what is left of a step's chunk is
computed over several steps, a part each, attending over the parts before it: a long prompt
delays the streams in flight by a chunk a step, not by its whole length at once (chunked
prefill; 0 computes each prompt whole as it is admitted). A sequence leaves when it meets an
end-of-sequence token, a stop string, its max_new_tokens or the context, or is cancelled; its
slot is free for the next step. The KV cache is allocated once (cache.py), for `slots`
sequences of `context` tokens.
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

from handlers.generation import attention
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
    key: str = ""  # what Engine.cancel finds it by

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


def prompt_chunk(asked: int) -> int:
    """Prompt tokens a step computes at most: a multiple of PROMPT_STEP, so that only a prompt's
    last part is padded; 0 (every admitted prompt whole) stays 0."""
    return max(PROMPT_STEP, asked // PROMPT_STEP * PROMPT_STEP) if asked else 0


class Scheduler:
    """What every engine shares: the queue of submitted sequences, admission into `slots`, the
    choice made for each new token (end of sequence, stop string, length), cancel and stop. An
    engine computes the steps (`step`, with `_admit` and `_accept`): Engine below with a torch
    model, openvino_engine.py with OpenVINO GenAI's pipeline."""

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        eos: set[int],
        slots: int,
        context: int,
        max_waiting: int = 64,
        name: str = "",
    ):
        self.decode, self.eos = decode, frozenset(eos)
        self.name, self.slots, self.context, self.max_waiting = name, slots, context, max_waiting
        self.active: dict[int, Running] = {}
        self.waiting: collections.deque[Running] = collections.deque()
        self.keyed: dict[str, Running] = {}  # submitted with a key (a request id), until they end
        self.lock = threading.Condition()
        self.stopping = False

    # -- any thread --------------------------------------------------------------------------
    def submit(self, generation: Generation, sink: Sink, key: str = "") -> Running:
        sequence = Running(generation, sink, TextStream(self.decode, generation.stop), generation.sampling.generator())
        with self.lock:
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(
                    f"all {self.slots} sequences are generating and {len(self.waiting)} requests wait; retry later"
                )
            self.waiting.append(sequence)
            if key:
                sequence.key, self.keyed[key] = key, sequence
            self.lock.notify()
        return sequence

    def cancel(self, key: str) -> bool:
        """Ends the sequence submitted with `key` at the next step (its slot, or its place in the
        queue, is free then); False when there is none (it has ended)."""
        with self.lock:
            sequence = self.keyed.get(key)
        if sequence is None:
            return False
        sequence.cancel()
        return True

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify()

    @property
    def busy(self) -> bool:
        return bool(self.active or self.waiting)

    @property
    def cache_bytes(self) -> int:
        """The KV cache's size (allocated once, for `slots` sequences of `context` tokens)."""
        raise NotImplementedError

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
        raise NotImplementedError

    def _admit(self) -> list[Running]:
        """Ends the cancelled sequences, then moves waiting ones into free slots: those admitted."""
        for sequence in list(self.active.values()):
            if sequence.cancelled:
                self._end(sequence, Finish.CANCELLED)
        admitted = []
        while len(self.active) < self.slots:
            with self.lock:
                if not self.waiting:
                    break
                sequence = self.waiting.popleft()
            if sequence.cancelled:
                self._end(sequence, Finish.CANCELLED)
                continue
            sequence.slot = min(set(range(self.slots)) - set(self.active))
            self.active[sequence.slot] = sequence
            admitted.append(sequence)
        return admitted

    def _accept(self, sequence: Running, token: int) -> None:
        """The sequence's next token: its text sent, or the sequence ended."""
        generation = sequence.generation
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
        if sequence.slot >= 0:
            self.active.pop(sequence.slot, None)
        with self.lock:
            self.keyed.pop(sequence.key, None)
        if sequence.cancelled:
            log.info(
                "%s: request %s cancelled after %d token(s); %d of %d sequences generating",
                self.name,
                sequence.key or "-",
                len(sequence.tokens),
                len(self.active),
                self.slots,
            )
        if rest := sequence.stream.finish():
            sequence.sink.text(rest)
        sequence.sink.finish(reason, len(sequence.generation.prompt), len(sequence.tokens))


class Engine(Scheduler):
    """The steps computed by a torch model (eager or compiled) on the kit's own KV cache."""

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
        super().__init__(decode, eos, slots, context, max_waiting, name)
        self.model = model
        self.itt = itt  # one ITT range per forward (prefill, decode or mixed step), for VTune
        self.prefill_chunk = prompt_chunk(prefill_chunk)
        self.cache = SlotCache(slots, context, dtype)
        self.mixes = attention.use(model)  # decode rows and a prompt's part in one forward

    @property
    def cache_bytes(self) -> int:
        return self.cache.bytes

    def step(self) -> None:
        """Admit what fits, compute prompts (a chunk's worth), and advance every sequence whose
        prompt is done by one token: in one forward with the first prompt's part where the model
        allows it (attention.py), else in a decode after the prompts."""
        with torch.inference_mode():
            self._admit()
            parts = self._prompt_parts()
            mixed = bool(parts) and self.mixes and self._decoding()
            if mixed:
                self._mixed(*parts.pop(0))
            for sequence, take in parts:
                logits = self._prefill(sequence, take)
                if not sequence.prefilling:
                    self._advance(sequence, logits)
            if not mixed and self._decoding():
                self._decode()

    def _decoding(self) -> bool:
        return any(not sequence.prefilling for sequence in self.active.values())

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor, **mixed
    ) -> torch.Tensor:
        """Logits [rows, len(keep), vocab] at the positions `keep` of each row: the vocabulary
        projection (151936 columns for Qwen) is made only where a token is chosen. The cache's
        selection (SlotCache.select) is the caller's."""
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

    def _prompt_parts(self) -> list[tuple[Running, int]]:
        """The prompt tokens this step computes, (sequence, how many), in the order the sequences
        were admitted, up to the step's chunk."""
        budget, parts = self.prefill_chunk or sys.maxsize, []
        for sequence in [s for s in self.active.values() if s.prefilling]:
            remaining = len(sequence.generation.prompt) - sequence.prefilled
            take = remaining if remaining <= budget else budget // PROMPT_STEP * PROMPT_STEP
            if take <= 0:
                break
            parts.append((sequence, take))
            budget -= take
        return parts

    def _part(self, sequence: Running, take: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The prompt's next `take` tokens (only its last part padded): ids and positions
        [1, length], and the mask [1, 1, length, kv] over its parts before them."""
        prompt, start = sequence.generation.prompt, sequence.prefilled
        last = start + take == len(prompt)
        length = span(take, self.context - start, PROMPT_STEP) if last else take
        ids = torch.zeros(1, length, dtype=torch.long)
        ids[0, :take] = torch.tensor(prompt[start : start + take])
        positions = torch.arange(start, start + length)[None]
        mask = (torch.arange(start + length)[None, :] <= positions[0][:, None])[None, None]
        return ids, positions, mask

    def _prefill(self, sequence: Running, take: int) -> torch.Tensor:
        """The prompt's next `take` tokens into the sequence's cache row, attending over its parts
        before them; the logits at the last of them (its first new token's, after the last part)."""
        ids, positions, mask = self._part(sequence, take)
        self.cache.select(slice(sequence.slot, sequence.slot + 1), positions, mask.shape[-1])
        logits = self._forward(ids, positions, mask, torch.tensor([take - 1]))[0, -1]
        sequence.prefilled += take
        return logits

    def _decode_rows(
        self, mixing: Running | None = None, part_end: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Ids and positions [rows, 1] feeding slot r's last token at row r, and the mask
        [rows, 1, 1, kv] over each row's cache. A slot holding no decoding sequence gets a row too
        (rows are the slots up to the last one taken); what it writes is never read: a prefilling
        slot's goes where its prompt's next part overwrites it, or, for the one whose part a mixed
        step computes (`mixing`), just past that part (part_end)."""
        rows = max(self.active) + 1
        ids = torch.zeros(rows, 1, dtype=torch.long)
        positions = torch.zeros(rows, 1, dtype=torch.long)
        for slot, sequence in self.active.items():
            if not sequence.prefilling:
                ids[slot, 0], positions[slot, 0] = sequence.tokens[-1], sequence.position
            elif sequence is mixing:
                # Past a last part's padding is the context's end at most: then its last padding.
                positions[slot, 0] = min(part_end, self.context - 1)
            else:
                positions[slot, 0] = sequence.prefilled
        kv_length = span(int(positions.max()) + 1, self.context)
        mask = (torch.arange(kv_length)[None, :] <= positions)[:, None, None, :]
        return ids, positions, mask

    def _decode(self) -> None:
        ids, positions, mask = self._decode_rows()
        self.cache.select(slice(0, ids.shape[0]), positions, mask.shape[-1])
        logits = self._forward(ids, positions, mask, DECODE_KEEP)
        for slot, sequence in list(self.active.items()):
            if not sequence.prefilling:
                self._advance(sequence, logits[slot, -1])

    def _mixed(self, sequence: Running, take: int) -> None:
        """One forward: a decode row per slot (as _decode) and `take` tokens of `sequence`'s prompt
        (as _prefill), flattened into one row of tokens; attention.py splits its attention."""
        ids, positions, mask = self._part(sequence, take)
        decode_ids, decode_positions, decode_mask = self._decode_rows(sequence, int(positions[0, -1]) + 1)
        rows = decode_ids.shape[0]
        slots = torch.cat([torch.arange(rows), torch.full((ids.shape[1],), sequence.slot)])[None]
        positions = torch.cat([decode_positions.T, positions], 1)
        self.cache.select_tokens(slots, positions, max(decode_mask.shape[-1], mask.shape[-1]))
        keep = torch.cat([torch.arange(rows), torch.tensor([rows + take - 1])])
        mixed = attention.Mixed(decode_mask, mask, torch.tensor([sequence.slot]))
        logits = self._forward(torch.cat([decode_ids.T, ids], 1), positions, mask, keep, mixed=mixed)[0]
        sequence.prefilled += take
        for slot, running in list(self.active.items()):
            if running is sequence:
                if not sequence.prefilling:
                    self._advance(sequence, logits[rows])
            elif not running.prefilling:
                self._advance(running, logits[slot])

    def _advance(self, sequence: Running, logits: torch.Tensor) -> None:
        """Choose the sequence's next token from its logits."""
        self._accept(sequence, sequence.generation.sampling.choose(logits, sequence.generator))
