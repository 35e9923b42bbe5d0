"""How many prompt tokens a step computes beside the decode rows (chunked prefill), chosen from
this machine's step times where the settings ask for it (`prefill_chunk: null`).

    times = StepTimes.measure(engine, prompt)    # at warm-up, after the compiler: ~12 steps
    chunk = times.chunk()                        # 64 on a 2-core EPYC (Qwen2.5-0.5B, 16 slots)

A step that computes a prompt's part beside the decode rows takes a decode step's time and the
part's: every stream in flight waits for it, so the part sets the inter-token latency's tail.
The chunk is the most prompt tokens that keep such a step within STEP_BUDGET decode steps:
chunks of 256 made a 16-stream step on 2 cores ten times a decode step (ITL p99 972 against p50
102 ms), where a 64-core server computes 256 tokens in a fraction of one. Not the default: on
those 2 cores, saturated, the chunk it chose (64) left prompts in their slots for more steps, so
fewer rows decoded in each: in one run, rounds in turns, 0.77 times the tokens a second, 1.6
times the time to first token, ITL p99 1.7 times its p50 against 12 (docs/generation.md,
"Chunked prefill").
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from handlers.generation.runner import PROMPT_STEP
from handlers.generation.scheduler import Scheduler
from handlers.generation.sequences import Discard, Generation

# A step with a prompt's part takes at most this many times a decode step of every slot: the
# inter-token latency's p99 stays within 4x its p50 (issue 57's bound) with room for noise.
STEP_BUDGET = 3.0
# Beyond this many tokens a part computes no faster per token (the products are already large);
# a longer chunk would only lengthen the steps.
MOST = 512
LEAST = 2 * PROMPT_STEP
PROBE = 64  # prompt tokens of the timed mixed steps
DECODE_STEPS = 5  # decode steps timed, and mixed steps after them (a median each)


@dataclasses.dataclass(frozen=True)
class StepTimes:
    decode_seconds: float  # a decode step of every slot
    token_seconds: float  # each prompt token a mixed step computes beside them

    def __str__(self) -> str:
        return f"measured: a decode step {self.decode_seconds * 1e3:.0f}ms, a prompt token {self.token_seconds * 1e3:.2f}ms"

    def chunk(self) -> int:
        """The prompt tokens a step may add while sequences decode (a multiple of PROMPT_STEP)."""
        room = (STEP_BUDGET - 1) * self.decode_seconds
        tokens = room / self.token_seconds if self.token_seconds > 0 else MOST
        return int(min(MOST, max(LEAST, tokens // PROMPT_STEP * PROMPT_STEP)))

    @classmethod
    def measure(cls, engine: Scheduler, prompt: Callable[[int, int], Generation]) -> StepTimes:
        """Time the engine's steps: every slot but one decoding, then with a prompt of PROBE tokens
        arriving in the free slot (computed whole: the engine's chunk is lifted meanwhile) and
        answered at once, DECODE_STEPS times. `prompt(length, new)` makes a generation of tokens
        of its own; every one ends by itself, nothing is cancelled. One slot: no prompt ever
        shares a step with decode rows, nothing to measure."""
        if engine.slots < 2:
            return cls(0.0, 0.0)
        chunk, engine.prefill_chunk = engine.prefill_chunk, 0
        try:
            new = 2 * DECODE_STEPS + 2  # decoding through every timed step, and after
            decoding = [engine.submit(prompt(2, new), Discard()) for _ in range(engine.slots - 1)]
            while not all(sequence.tokens for sequence in decoding):
                engine.step()
            decode = [timed(engine.step) for _ in range(DECODE_STEPS)]
            mixed = []
            for _ in range(DECODE_STEPS):
                engine.submit(prompt(PROBE, 1), Discard())
                mixed.append(timed(engine.step))
            while engine.busy:
                engine.step()
        finally:
            engine.prefill_chunk = chunk
        step = statistics.median(decode)
        return cls(step, max(0.0, statistics.median(mixed) - step) / PROBE)


def timed(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start
