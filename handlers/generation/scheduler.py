"""What every generation engine shares: the queue, admission, each new token's fate, cancel and stop.

    scheduler.submit(Generation(prompt_ids, max_new_tokens=64), sink, key="r1")   # any thread
    scheduler.cancel("r1")          # the client went away: it ends at the next step
    scheduler.run_forever()         # the engine's thread: step() while anything is in flight

A request's sequence waits in a queue (bounded: a full one refuses with QueueFull, a 503), is
admitted into one of `slots` places when one is free (`_place` says which: the engine's
choice), and gets its tokens from the engine's steps (`_accept`): it ends at an
end-of-sequence token, a stop string, its max_new_tokens or the context's end, or when
cancelled. engine.py computes the steps with a torch model, openvino_engine.py with OpenVINO
GenAI's pipeline.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence

import torch

from handlers.generation.grammar import Dialect, Matcher
from handlers.generation.logprobs import TokenLogprob
from handlers.generation.metrics import EngineMetrics, Gauges
from handlers.generation.sequences import Finish, Generation, QueueFull, Sink, Usage
from handlers.generation.stream import TextStream

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class Running:
    """A request's sequence from submit to its end: waiting for a slot (slot -1), then in one."""

    generation: Generation
    sink: Sink
    stream: TextStream
    generator: torch.Generator | None
    slot: int = -1
    tokens: list[int] = dataclasses.field(default_factory=list)  # generated so far
    computed: int = 0  # tokens (prompt, then generated) whose keys and values are in its cache row
    cancelled: bool = False
    submitted: float = dataclasses.field(default_factory=time.perf_counter)
    key: str = ""  # what Engine.cancel finds it by
    logprobs: list[TokenLogprob] = dataclasses.field(default_factory=list)  # tokens whose text is not yet sent
    matcher: Matcher | None = None  # where it is in its constraint's grammar
    drafted: int = 0  # tokens prompt lookup drafted for it (engine.py)
    kept: int = 0  # of them, those it kept
    draft_at: int = 0  # drafts resume when it has this many tokens (engine.py: after refused drafts)
    refusals: int = 0  # drafts refused in a row
    last_token_at: float | None = None  # when its latest token was chosen (perf_counter)
    preemptions: int = 0  # times its place was taken back to make room (engine.py), its tokens kept

    @property
    def known(self) -> tuple[int, ...]:
        """Its prompt and the tokens generated: what its cache is to hold."""
        return self.generation.prompt + tuple(self.tokens)

    def token_at(self, index: int) -> int:
        """known[index], without making `known`."""
        prompt = self.generation.prompt
        return prompt[index] if index < len(prompt) else self.tokens[index - len(prompt)]

    @property
    def pending(self) -> int:
        """Tokens not yet in its cache: its prompt's rest, or 1 (the last token, fed next)."""
        return len(self.generation.prompt) + len(self.tokens) - self.computed

    @property
    def prefilling(self) -> bool:
        """More than one token to compute (its prompt's rest) before its next."""
        return self.pending > 1

    @property
    def position(self) -> int:
        """Where the last generated token goes in the cache (it is fed in the next decode)."""
        return len(self.generation.prompt) + len(self.tokens) - 1

    def cancel(self) -> None:
        self.cancelled = True  # read by the engine's thread at its next step


class Scheduler:
    """What every engine shares: the queue of submitted sequences, admission into `slots`, the
    choice made for each new token (end of sequence, stop string, length), cancel and stop. An
    engine computes the steps (`step`, with `_admit`, `_place` and `_accept`): engine.py with a
    torch model, openvino_engine.py with OpenVINO GenAI's pipeline."""

    unserved: frozenset[str] = frozenset()  # request fields its steps cannot follow (fields.check)
    lookup = 0  # draft tokens a step checks (prompt lookup: engine.py); 0 where its steps cannot
    dialect = Dialect.LLGUIDANCE  # how a request's grammar reaches its steps (grammar.py)
    # Whether its first steps at sizes not met before compile (a compiler tracing the model, a
    # runtime compiling kernels per shape): the warm-up then meets every size twice (warm_up.py).
    compiles_at_first_steps = True

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
        self.keyed: dict[str, list[Running]] = {}  # submitted with a key (a request id), until they end
        self.lock = threading.Condition()
        self.stopping = False
        self.metrics = EngineMetrics()  # the handler gives it a fresh one after its warm-up

    def gauges(self) -> Gauges:
        """Read by the metrics writer's thread (metrics.py), between steps or during one."""
        return Gauges(len(self.active), len(self.waiting), self.kv_cache_usage(), self.prefix_store_bytes())

    def kv_cache_usage(self) -> float:
        """The KV cache's share holding sequences' tokens (0 where the engine cannot tell)."""
        return 0.0

    def prefix_store_bytes(self) -> int:
        """The KV bytes held beside the rows by a prefix store (0: the engine has none)."""
        return 0

    # -- any thread --------------------------------------------------------------------------
    def submit(self, generation: Generation, sink: Sink, key: str = "") -> Running:
        return self.submit_all([(generation, sink)], key)[0]

    def submit_all(self, asked: Sequence[tuple[Generation, Sink]], key: str = "") -> list[Running]:
        """The sequences of one request (its choices), queued together or, when the queue cannot
        take them all, none (QueueFull)."""
        sequences = [
            Running(
                generation,
                sink,
                TextStream(self.decode, generation.stop),
                generation.sampling.generator(),
                key=key,
                matcher=generation.constraint.matcher() if generation.constraint else None,
            )
            for generation, sink in asked
        ]
        with self.lock:
            if len(self.waiting) + len(sequences) > self.max_waiting:
                raise QueueFull(
                    f"{len(self.active)} sequences are generating and {len(self.waiting)} requests wait; retry later"
                )
            self.waiting.extend(sequences)
            if key:
                self.keyed.setdefault(key, []).extend(sequences)
            self.lock.notify()
        return sequences

    def cancel(self, key: str) -> bool:
        """Ends the sequences submitted with `key` at the next step (their slots, or their places in
        the queue, are free then); False when there are none (they have ended)."""
        with self.lock:
            sequences = list(self.keyed.get(key, ()))
        for sequence in sequences:
            sequence.cancel()
        return bool(sequences)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify()

    @property
    def busy(self) -> bool:
        return bool(self.active or self.waiting)

    @property
    def cache_bytes(self) -> int:
        """The KV cache's size: what its sequences' keys and values may hold at most."""
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
                sequence = self.waiting[0]
                if self.active and not sequence.cancelled and not self._room_for(sequence):
                    break  # in order: it waits for room, and those behind it with it
                self.waiting.popleft()
            if sequence.cancelled:
                self._end(sequence, Finish.CANCELLED)
                continue
            sequence.slot = self._place(sequence)
            self.active[sequence.slot] = sequence
            if not sequence.preemptions:  # a request is admitted once, whatever it is computed again for
                prompt = len(sequence.generation.prompt)
                # The prefix cache's find (engine.py's _place): the prompt's tokens already computed.
                self.metrics.admitted(time.perf_counter() - sequence.submitted, prompt, min(sequence.computed, prompt))
            admitted.append(sequence)
        return admitted

    def _room_for(self, sequence: Running) -> bool:
        """Whether the engine's cache has room for the sequence beside those in flight (asked
        only when some are: alone, a sequence always fits)."""
        return True

    def _requeue(self, sequence: Running) -> None:
        """The sequence out of its place and first in the queue, to be computed again from its
        prompt and the tokens it has (preempted: the engine needs its room)."""
        self.active.pop(sequence.slot, None)
        sequence.slot, sequence.computed = -1, 0
        sequence.preemptions += 1
        self.metrics.preempted()
        with self.lock:
            self.waiting.appendleft(sequence)

    def _place(self, sequence: Running) -> int:
        """The free slot the sequence takes (there is one)."""
        return min(set(range(self.slots)) - set(self.active))

    def _accept(self, sequence: Running, token: int, logits: torch.Tensor | None = None) -> None:
        """The sequence's next token, chosen from `logits` (given where the request asks for its
        log-probabilities): its text sent, or the sequence ended."""
        chosen = time.perf_counter()
        self.metrics.token(sequence.last_token_at is None, chosen - (sequence.last_token_at or sequence.submitted))
        sequence.last_token_at = chosen
        generation = sequence.generation
        if token in self.eos and not generation.ignore_eos:
            self._end(sequence, Finish.STOP)
            return
        sequence.tokens.append(token)
        if logits is not None and generation.logprobs is not None:
            sequence.logprobs.append(TokenLogprob.of(logits, token, generation.logprobs, self.decode))
        delta = sequence.stream.push(token)
        if delta:
            sequence.sink.text(delta, self._released(sequence))
        if sequence.stream.stopped:
            self._end(sequence, Finish.STOP)
        elif len(sequence.tokens) >= generation.max_new_tokens or sequence.position >= self.context:
            self._end(sequence, Finish.LENGTH)

    @staticmethod
    def _released(sequence: Running) -> list[TokenLogprob]:
        """The entries of the tokens held until text goes out: with it."""
        released, sequence.logprobs = sequence.logprobs, []
        return released

    def _end(self, sequence: Running, reason: Finish) -> None:
        if sequence.slot >= 0:
            self.active.pop(sequence.slot, None)
        with self.lock:
            siblings = self.keyed.get(sequence.key, [])
            if sequence in siblings:
                siblings.remove(sequence)
            if not siblings:
                self.keyed.pop(sequence.key, None)
        # A request's prompt counts once, with its last choice to end (as its usage does).
        prompt = len(sequence.generation.prompt) if not siblings else 0
        self.metrics.ended(reason.value, time.perf_counter() - sequence.submitted, prompt, len(sequence.tokens))
        if sequence.cancelled:
            log.info(
                "%s: request %s cancelled after %d token(s); %d of %d sequences generating",
                self.name,
                sequence.key or "-",
                len(sequence.tokens),
                len(self.active),
                self.slots,
            )
        rest = sequence.stream.finish()
        # The held tokens' entries go out with the rest of the text, even where their text is
        # none (a token of no text of its own); a stop string's, never sent, are dropped.
        held = [] if sequence.stream.stopped else self._released(sequence)
        if rest or held:
            sequence.sink.text(rest, held)
        sequence.sink.finish(
            reason,
            Usage(
                len(sequence.generation.prompt),
                len(sequence.tokens),
                sequence.kept,
                sequence.drafted - sequence.kept,
            ),
        )
