"""A request's sampling parameters, checked once, and the next token they choose.

    sampling = Sampling.parse({"temperature": 0.7, "top_p": 0.9, "seed": 1}, defaults)
    token = sampling.choose(logits_row, generator)     # greedy (argmax) when temperature is 0

The order is transformers' (temperature, then top-k, then top-p, then a draw), so a seeded
request draws from the distribution `generate` would. A wrong type or range is an InvalidInput
naming the parameter and what it takes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from handlers.payload import InvalidInput

SEED_LIMIT = 2**63 - 1  # torch.Generator.manual_seed's range


def number(body: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"{name} must be a number from {low} to {high}, got {value!r}")
    if not low <= value <= high:
        raise InvalidInput(f"{name} must be from {low} to {high}, got {value}")
    return float(value)


def integer(body: Mapping[str, Any], name: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    if not low <= value <= high:
        raise InvalidInput(f"{name} must be from {low} to {high}, got {value}")
    return value


@dataclasses.dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no limit
    seed: int | None = None

    @classmethod
    def parse(cls, body: Mapping[str, Any], defaults: Sampling) -> Sampling:
        return cls(
            temperature=number(body, "temperature", defaults.temperature, 0.0, 100.0),
            top_p=number(body, "top_p", defaults.top_p, 0.0, 1.0) or 1.0,
            top_k=integer(body, "top_k", defaults.top_k, 0, 2**31 - 1) or 0,
            seed=integer(body, "seed", None, 0, SEED_LIMIT),
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self) -> torch.Generator | None:
        """A draw of its own for a seeded request: the same seed, the same answer, whatever runs beside it."""
        if self.greedy or self.seed is None:
            return None
        return torch.Generator().manual_seed(self.seed)

    def choose(self, logits: torch.Tensor, generator: torch.Generator | None) -> int:
        """logits: [vocab] float32 -> the next token id."""
        if self.greedy:
            return int(logits.argmax())
        scores = logits / self.temperature
        if 0 < self.top_k < scores.shape[-1]:
            kth = torch.topk(scores, self.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, -math.inf)
        if self.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=False)
            cumulative = ordered.softmax(-1).cumsum(-1)
            drop = cumulative <= 1 - self.top_p
            drop[-1] = False  # the likeliest token always stays
            scores = scores.masked_fill(drop.scatter(0, order, drop), -math.inf)
        return int(torch.multinomial(scores.softmax(-1), 1, generator=generator))
