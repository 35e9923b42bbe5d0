"""Every kind of step a request takes, computed before the first request (compiled, where the
model is).

    step_times = WarmUp(engine, tokenizer, settings).run()   # StepTimes where the prefill chunk is left open

Where nothing compiles at a first step (an eager model; a compiled one whose every kind of step
was loaded whole from its archive, precompiled.py), one prompt alone computes each kind once:
the first call of each is slow (kernels' libraries loaded, threads started), a later size is not.
The build that saved the whole graphs ran the full warm-up below, so the shapes it meets passed
their guards there; where that prompt's shapes fail them (a worker's settings the build did not
have), the full warm-up follows. Qwen2.5-0.5B's shape spent 8 s of a 17 s restart in the full
one (2-core AMD EPYC, docs/generation.md "Start").

Elsewhere the compiler traces each graph (decode rows; a prompt's part, alone or mixed with
decode rows) at its first call and again at the first call whose sizes differ from it, after
which it is general. So each size is met twice, each time with values no other size has (a
size equal to another would be tied to it): a prompt alone (one decode row with idle ones)
whose decode crosses a span boundary (two spans); every slot at once; prompts arriving while
others decode; prompts whose first blocks are in the prefix cache, alone and arriving (a part
that starts past position 0). Each prompt is of a token of its own, so that none finds
another's blocks but where meant to, and generates a few tokens: each compiled call is slow the
first time, and a longer warm-up only computes more of what is already compiled.
"""

from __future__ import annotations

import itertools

from handlers.generation.chunking import StepTimes
from handlers.generation.engine import Engine
from handlers.generation.runner import PROMPT_STEP, SPAN_STEP
from handlers.generation.scheduler import Scheduler
from handlers.generation.sequences import Discard, Generation
from handlers.generation.settings import GenerationSettings


class WarmUp:
    def __init__(self, engine: Scheduler, tokenizer, settings: GenerationSettings):
        self.engine, self.settings = engine, settings
        self.tokens = itertools.count((tokenizer("Hello")["input_ids"] or [0])[0])
        self.vocabulary = len(tokenizer)

    def prompt(self, length: int, new: int = 3) -> Generation:
        """`length` tokens of a token no other warm-up prompt has."""
        return self.of(next(self.tokens) % self.vocabulary, length, new)

    def of(self, token: int, length: int, new: int) -> Generation:
        """`length` tokens and `new` more (what the context holds)."""
        context = self.settings.context_length
        prompt = (token,) * min(length, context - 1)
        return Generation(prompt, max(1, min(new, context - len(prompt))), ignore_eos=True)

    def longer(self, generation: Generation) -> Generation:
        """The prompt and 8 tokens more (what the context holds): it begins with the other's blocks."""
        return self.of(generation.prompt[0], len(generation.prompt) + 8, generation.max_new_tokens)

    def run(self) -> StepTimes | None:
        """Every kind of step computed; the step times, where the settings leave the chunk open."""
        if not self.engine.compiles_at_first_steps:
            self.warm(self.prompt(PROMPT_STEP + 1))  # a part (with idle rows where it mixes), then decode rows
        if self.engine.compiles_at_first_steps:  # also where that prompt's shapes failed a loaded graph's guards
            self.every_size()
        if self.settings.prefill_chunk is None and isinstance(self.engine, Engine):
            return StepTimes.measure(self.engine, self.prompt)
        return None

    def every_size(self) -> None:
        """Each size of each kind of step met twice (above)."""
        engine, prompt = self.engine, self.prompt
        self.warm(prompt(SPAN_STEP - 1))  # decodes at SPAN_STEP - 1 and SPAN_STEP: spans of 1 and 2 steps
        self.warm(*(prompt(2) for _ in range(self.settings.max_sequences)))
        for length in (2, SPAN_STEP + 1) if engine.mixes else ():
            self.warm(prompt(3, new=5), prompt(length), arriving=1)
        cached = prompt(SPAN_STEP + 1)
        self.warm(cached)
        self.warm(self.longer(cached))  # its first blocks found: a part from a block's end
        if engine.mixes:
            self.warm(prompt(3, new=5), self.longer(self.longer(cached)), arriving=1)

    def warm(self, *generations: Generation, arriving: int = 0) -> None:
        """Step the engine until `generations` are answered; the last `arriving` of them are
        submitted when the others decode."""
        first = [self.engine.submit(g, Discard()) for g in generations[: len(generations) - arriving]]
        while self.engine.busy and not all(sequence.tokens for sequence in first):
            self.engine.step()
        for generation in generations[len(first) :]:
            self.engine.submit(generation, Discard())
        while self.engine.busy:
            self.engine.step()
