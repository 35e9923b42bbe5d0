"""A chosen token's log-probability and its likeliest alternatives, as OpenAI's `logprobs` return them.

    entry = TokenLogprob.of(logits_row, token, top=3, decode=lambda ids: tokenizer.decode(ids))

The model's own distribution: the log-softmax of its logits, in float32, before any bias,
penalty, temperature or top-k/top-p (vLLM's default, and what transformers' scores give), so
the numbers say what the model thought whatever the request's sampling did with them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

MAX_TOP = 20  # OpenAI's top_logprobs limit


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    token: str  # the token's own text
    logprob: float
    top: tuple[tuple[str, float], ...] = ()  # the likeliest tokens, likeliest first

    @classmethod
    def of(cls, logits: torch.Tensor, token: int, top: int, decode: Callable[[Sequence[int]], str]) -> TokenLogprob:
        """logits: [vocab] -> the entry of `token`, with the `top` likeliest beside it."""
        scores = logits.float().log_softmax(-1)
        likeliest = torch.topk(scores, top) if top else None
        alternatives = (
            () if likeliest is None else zip(likeliest.indices.tolist(), likeliest.values.tolist(), strict=True)
        )
        return cls(decode([token]), float(scores[token]), tuple((decode([i]), v) for i, v in alternatives))
