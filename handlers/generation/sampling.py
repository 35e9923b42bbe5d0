"""A request's sampling parameters, checked once, and the next token they choose.

    sampling = Sampling.parse({"temperature": 0.7, "top_p": 0.9, "seed": 1}, defaults, vocabulary)
    token = sampling.choose(logits_row, generator, prompt, tokens)  # greedy (argmax) at temperature 0

The logits are first biased (OpenAI's `logit_bias`) and penalised: `repetition_penalty` as
transformers' (every token of the prompt and the answer: a positive logit divided by it, a
negative one multiplied), then OpenAI's `presence_penalty` and `frequency_penalty` (the answer's
tokens: minus the first once, minus the second per occurrence), as vLLM orders them; greedy is
the argmax of what is left. Then transformers' order (temperature, top-k, top-p, a draw), so a
seeded request draws from the distribution `generate` would. A wrong type or range is an
InvalidInput naming the parameter and what it takes.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from handlers.payload import InvalidInput

SEED_LIMIT = 2**63 - 1  # torch.Generator.manual_seed's range
BIAS_LIMIT = 100.0  # OpenAI's logit_bias range, either side of 0
MAX_BIASES = 300  # OpenAI's limit on logit_bias entries


ARGMAX_CHUNK = 1024


def first_argmax(logits: torch.Tensor) -> int:
    """`int(logits.argmax())` of a [vocab] row, ties and NaNs alike (the first largest, a NaN the
    largest). aten's argmax keeps an index per element and is not vectorized (130 us over a
    152K-token vocabulary on a Zen 4 EPYC: 2 ms of a 16-stream decode step); a max is (14 us). So
    the largest of each chunk first, then the index within the first chunk holding the largest:
    41 us."""
    whole = logits.numel() // ARGMAX_CHUNK * ARGMAX_CHUNK
    if whole == 0:
        return int(logits.argmax())
    maxima = logits[:whole].reshape(-1, ARGMAX_CHUNK).amax(-1)
    if whole < logits.numel():
        maxima = torch.cat((maxima, logits[whole:].amax().unsqueeze(0)))
    start = int(maxima.argmax()) * ARGMAX_CHUNK
    return start + int(logits[start : start + ARGMAX_CHUNK].argmax())


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
    repetition_penalty: float = 1.0  # 1: none
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)

    @classmethod
    def parse(cls, body: Mapping[str, Any], defaults: Sampling, vocabulary: int = 2**31 - 1) -> Sampling:
        repetition = number(body, "repetition_penalty", defaults.repetition_penalty, 0.0, 10.0)
        if repetition == 0:
            raise InvalidInput("repetition_penalty must be above 0 (1: none), got 0")
        return cls(
            temperature=number(body, "temperature", defaults.temperature, 0.0, 100.0),
            top_p=number(body, "top_p", defaults.top_p, 0.0, 1.0) or 1.0,
            top_k=integer(body, "top_k", defaults.top_k, 0, 2**31 - 1) or 0,
            seed=integer(body, "seed", None, 0, SEED_LIMIT),
            repetition_penalty=repetition,
            presence_penalty=number(body, "presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            logit_bias=_logit_bias(body.get("logit_bias"), vocabulary),
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def adjusts(self) -> bool:
        """The logits are biased or penalised before the choice."""
        return (
            bool(self.logit_bias)
            or self.repetition_penalty != 1.0
            or bool(self.presence_penalty or self.frequency_penalty)
        )

    def adjusted(self, logits: torch.Tensor, prompt: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """logits: [vocab] -> biased and penalised (a copy), after `prompt` and the answer's `tokens`."""
        logits = logits.clone()
        if self.logit_bias:
            ids, biases = zip(*self.logit_bias, strict=True)
            logits[list(ids)] += torch.tensor(biases, dtype=logits.dtype)
        if self.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(prompt) | set(tokens)), dtype=torch.long)
            scores = logits[seen]
            logits[seen] = torch.where(scores < 0, scores * self.repetition_penalty, scores / self.repetition_penalty)
        if (self.presence_penalty or self.frequency_penalty) and tokens:
            counts = collections.Counter(tokens)
            ids = torch.tensor(list(counts), dtype=torch.long)
            times = torch.tensor(list(counts.values()), dtype=logits.dtype)
            logits[ids] -= self.presence_penalty + self.frequency_penalty * times
        return logits

    def generator(self) -> torch.Generator | None:
        """A draw of its own for a seeded request: the same seed, the same answer, whatever runs beside it."""
        if self.greedy or self.seed is None:
            return None
        return torch.Generator().manual_seed(self.seed)

    def choose(
        self,
        logits: torch.Tensor,
        generator: torch.Generator | None,
        prompt: Sequence[int] = (),
        tokens: Sequence[int] = (),
    ) -> int:
        """logits: [vocab] float32 -> the next token id, after `prompt` and the answer's `tokens`."""
        if self.adjusts:
            logits = self.adjusted(logits, prompt, tokens)
        if self.greedy:
            return first_argmax(logits)
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


def _logit_bias(value: Any, vocabulary: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} -> (id, bias) pairs, each checked."""
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > MAX_BIASES:
        raise InvalidInput(f'logit_bias must be an object of at most {MAX_BIASES} "token id": bias, got {value!r}')
    pairs = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < vocabulary):
            raise InvalidInput(f"logit_bias: {key!r} is not a token id of this model (0 to {vocabulary - 1})")
        name = f'logit_bias["{key}"]'
        pairs.append((int(key), number({name: bias}, name, 0.0, -BIAS_LIMIT, BIAS_LIMIT)))
    return tuple(pairs)
