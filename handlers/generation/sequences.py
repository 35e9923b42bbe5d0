"""What a sequence is asked for and what it gives back: the engine's contract with the API.

    sequence = scheduler.submit(Generation(prompt_ids, max_new_tokens=64), sink)   # scheduler.py
    sink.text(delta, logprobs); sink.finish(Finish.STOP, Usage(12, 64))             # respond.py answers from these

A request (api.py) becomes one Generation per choice; the engine (scheduler.py, engine.py,
openvino_engine.py) sends each one's text to its Sink as it comes and ends it with why and what
it took; a full queue refuses with QueueFull (a 503).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any, Protocol

from handlers.generation.grammar import Constraint
from handlers.generation.logprobs import TokenLogprob
from handlers.generation.sampling import Sampling


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
    logprobs: int | None = None  # each token's log-probability and this many alternatives; None: none
    constraint: Constraint | None = None  # a grammar every token follows (response_format); None: free text


@dataclasses.dataclass(frozen=True)
class Usage:
    """What a request's sequences took: the prompt's tokens (counted once for its choices), the
    tokens generated, and of the tokens prompt lookup drafted for them (lookup.py), those kept and
    those refused (OpenAI's accepted / rejected_prediction_tokens)."""

    prompt_tokens: int
    completion_tokens: int
    accepted_drafts: int = 0
    rejected_drafts: int = 0

    def plus(self, other: Usage) -> Usage:
        """Two choices of one request: one prompt, their generated and drafted tokens summed."""
        return Usage(
            other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.accepted_drafts + other.accepted_drafts,
            self.rejected_drafts + other.rejected_drafts,
        )

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        if self.accepted_drafts or self.rejected_drafts:
            body["completion_tokens_details"] = {
                "accepted_prediction_tokens": self.accepted_drafts,
                "rejected_prediction_tokens": self.rejected_drafts,
            }
        return body


NO_USAGE = Usage(0, 0)


class Sink(Protocol):
    """Where a sequence's text goes (the handler answers its client from these calls)."""

    def text(self, delta: str, logprobs: Sequence[TokenLogprob] = ()) -> None:
        """`logprobs`: of the tokens whose text `delta` releases (when the request asks for them)."""

    def finish(self, reason: Finish, usage: Usage) -> None: ...


class Discard:
    """A sink for text nobody reads (the warm-up's)."""

    def text(self, delta: str, logprobs: Sequence[TokenLogprob] = ()) -> None:
        pass

    def finish(self, reason: Finish, usage: Usage) -> None:
        pass
