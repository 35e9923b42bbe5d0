"""What the engine's tests share (test_engine.py, test_prefix.py, test_lookup.py,
test_kv_budget.py): an engine over a tiny random model, transformers' greedy answer to compare
with, and a sink that records what a sequence streamed. The models: conftest.py's `lm`."""

from __future__ import annotations

import torch

from handlers.generation.engine import Engine
from handlers.generation.sequences import Finish, Generation, Usage

# Prompts of different lengths, one longer than a padding step (64), one token long.
PROMPTS = ["The committee postponed", "A", "Interest rates rose again this quarter, " * 6, "fox jumps"]


class Recorder:
    def __init__(self):
        self.parts: list[str] = []
        self.logprobs: list = []
        self.reason: Finish | None = None
        self.usage: Usage | None = None

    def text(self, delta: str, logprobs=()) -> None:
        self.parts.append(delta)
        self.logprobs += logprobs

    def finish(self, reason: Finish, usage: Usage) -> None:
        self.reason, self.usage = reason, usage


def engine(
    model,
    tokenizer,
    slots: int = 3,
    context: int = 256,
    eos: set[int] | None = None,
    waiting: int = 16,
    chunk: int = 0,
    block_size: int = 16,
    prefix_caching: bool = True,
    prefix_store_bytes: int = 0,
):
    eos = set() if eos is None else eos
    return Engine(
        model,
        tokenizer.decode,
        eos,
        slots,
        context,
        torch.float32,
        waiting,
        prefill_chunk=chunk,
        block_size=block_size,
        prefix_caching=prefix_caching,
        prefix_store_bytes=prefix_store_bytes,
    )


def reference(model, ids: list[int], new: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def run(engine_: Engine, sequences: list, joining: list[tuple[Generation, Recorder]], after_steps: int) -> None:
    """Step the engine; the `joining` requests arrive after `after_steps` steps, mid-generation."""
    for step in range(10_000):
        if step == after_steps:
            sequences += [engine_.submit(g, r) for g, r in joining]
        if not engine_.busy and step > after_steps:
            return
        engine_.step()


def counted(eng: Engine) -> list[int]:
    """The tokens each forward of `eng` computes (padding included), as it runs."""
    tokens: list[int] = []
    forward = eng.runner._forward

    def counting(ids, *args, **kwargs):
        tokens.append(ids.numel())
        return forward(ids, *args, **kwargs)

    eng.runner._forward = counting
    return tokens


def budgeted(model, tokenizer, positions: int, slots: int = 3, context: int = 256, **options) -> Engine:
    """An engine whose KV cache holds `positions` in all (kv_budget.py)."""
    return Engine(model, tokenizer.decode, set(), slots, context, torch.float32, kv_positions=positions, **options)


# A prompt that repeats itself: prompt lookup finds drafts in it (and a random model repeats too).
REPEATING = "the cat sat on the mat and the cat sat on the mat and the cat sat on the"
