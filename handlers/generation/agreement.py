"""The accuracy guard of a language model served at reduced precision: its next tokens against
the float model's, on held-out prompts, before the first request.

    guard = limits(settings)                                # None: the precision is not judged
    reference = Reference.of(model, prompts, tokens=32)    # the float32 model, before conversion
    reference.save(staging)                                 # make archive ships it ...
    reference = Reference.shipped(model_dir, prompts, 32)  # ... and a worker reads it (None: not for these prompts)
    agreement = measure(model, reference, settings.kv_cache)  # the converted one, as it serves
    agreement.summary()    # "greedy tokens 96.9% equal (248 of 256 positions, 8 prompts), next-token distance ..."
    require(agreement, guard, settings.precision)           # AccuracyError naming the numbers

Each prompt is continued by the float model (greedy, `tokens` tokens; end-of-sequence tokens do
not stop it, so every prompt counts as many positions). Both models then read the same text,
the prompt and that continuation ("teacher forcing"): at each position of the continuation,
the served model's greedy token is compared with the float model's, and their next-token
distributions by total variation distance (half the L1 distance: 0 when equal, 1 when they
share nothing). Teacher forcing keeps one early difference from making every later position
differ: each position is judged on the same context.

`make archive` runs the float model on the held-out prompts and ships its answers
(model_store/lm_reference.py): a worker that reads them converts its weights without running the
float model, so it never reads every float32 weight at its start, and starts sooner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from handlers.accuracy import AccuracyError
from handlers.backends import DType
from handlers.calibration import SENTENCES
from handlers.generation.cache import KvShape, SlotCache
from handlers.generation.runner import Part, Runner
from handlers.generation.settings import GenerationSettings, KvCache
from handlers.samples import UserSamples
from handlers.settings import Weights


def judged_tokens(settings: GenerationSettings) -> int:
    """Tokens each held-out prompt is continued by: the settings', within the context."""
    return max(1, min(settings.accuracy_tokens, settings.context_length - 2))


def held_out_prompts(
    model_dir: Path, settings: GenerationSettings, tokenize: Callable[[str], list[int]]
) -> list[list[int]]:
    """The prompts the guard judges on: yours (make model ... SAMPLES=; none calibrates anything
    here), else the kit's sentences, each cut to leave room for its continuation in the context."""
    user = UserSamples.load(model_dir)
    texts = [body.decode() for body in user.calibration + user.held_out] if user else list(SENTENCES)
    room = settings.context_length - judged_tokens(settings)
    return [ids[-room:] for ids in map(tokenize, texts[: settings.accuracy_prompts]) if ids]


# The float model's answers in an archive (written by make archive, read by its workers).
REFERENCE_FILE = "generation_reference.pt"
# Stored in float16, times 2**14: a 151,936-token vocabulary's flat distribution (6.6e-6 a
# token) stays in float16's normal range (below 6.1e-5 it would keep fewer digits) and 1.0 stays
# below its largest (65504), so each probability is kept within 2**-11 of itself (total
# variation moves by 2.4e-4 at most) in half of float32's bytes: 78 MB for 8 prompts x 32 tokens
# x that vocabulary. The greedy tokens are stored exactly.
STORED_SCALE = 2.0**14


@dataclasses.dataclass(frozen=True)
class Judged:
    """One prompt continued by the float model, and the float model's answers along it."""

    ids: torch.Tensor  # (1, prompt + continuation) token ids
    start: int  # the position whose logits predict the continuation's first token
    probabilities: torch.Tensor  # (continuation, vocabulary) float32: the float model's next-token distributions
    greedy: torch.Tensor  # (continuation,) the float model's most likely next tokens, from those distributions

    @property
    def made_for(self) -> tuple[list[int], int]:
        """The prompt and how many tokens continued it."""
        return self.ids[0, : self.start + 1].tolist(), self.ids.shape[1] - self.start - 1


@dataclasses.dataclass(frozen=True)
class Reference:
    prompts: tuple[Judged, ...]

    @classmethod
    @torch.no_grad()
    def of(cls, model: nn.Module, prompts: Sequence[Sequence[int]], tokens: int) -> Reference:
        """`model` (the float one) continues each prompt by `tokens` greedy tokens."""
        judged = []
        for prompt in prompts:
            ids = torch.tensor([list(prompt)])
            continued = greedy(model, ids, tokens)
            start = ids.shape[1] - 1
            probabilities = next_token_probabilities(model, continued, start)
            judged.append(Judged(continued, start, probabilities, probabilities.argmax(-1)))
        return cls(tuple(judged))

    @property
    def positions(self) -> int:
        return sum(p.probabilities.shape[0] for p in self.prompts)

    def save(self, model_dir: Path) -> Path:
        path = model_dir / REFERENCE_FILE
        stored = [
            {"ids": j.ids, "start": j.start, "greedy": j.greedy, "scaled": (j.probabilities * STORED_SCALE).half()}
            for j in self.prompts
        ]
        torch.save(stored, path)
        return path

    @classmethod
    def shipped(cls, model_dir: Path, prompts: Sequence[Sequence[int]], tokens: int) -> Reference | None:
        """The archive's answers (save), when they were made for these prompts and tokens: None
        when there are none, or when the held-out prompts changed since (the samples, the
        settings' accuracy_prompts or accuracy_tokens)."""
        path = model_dir / REFERENCE_FILE
        if not path.is_file():
            return None
        stored = torch.load(path, map_location="cpu", weights_only=True)
        judged = tuple(Judged(s["ids"], s["start"], s["scaled"].float() / STORED_SCALE, s["greedy"]) for s in stored)
        if [j.made_for for j in judged] != [(list(prompt), tokens) for prompt in prompts]:
            return None
        return cls(judged)


def greedy(model: nn.Module, ids: torch.Tensor, tokens: int) -> torch.Tensor:
    """`ids` and the `tokens` most likely next ones, one at a time on the model's own cache; an
    end-of-sequence token is one more token here (generate's configs would stop at it)."""
    out = model(input_ids=ids, use_cache=True)
    for step in range(tokens):
        ids = torch.cat([ids, out.logits[:, -1:].argmax(-1)], dim=1)
        if step + 1 < tokens:
            out = model(input_ids=ids[:, -1:], past_key_values=out.past_key_values, use_cache=True)
    return ids


def next_token_probabilities(model: nn.Module, ids: torch.Tensor, start: int) -> torch.Tensor:
    """The model's next-token distribution at every position from `start` to the last but one."""
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, start:-1]
    return logits.float().softmax(-1)


@dataclasses.dataclass(frozen=True)
class Agreement:
    prompts: int
    positions: int
    equal: int  # positions where the served model's greedy token is the float model's
    distance_mean: float  # total variation distance of the next-token distributions
    distance_max: float

    @property
    def match_rate(self) -> float:
        return self.equal / self.positions if self.positions else 1.0

    def summary(self) -> str:
        return (
            f"greedy tokens {self.match_rate:.1%} equal ({self.equal} of {self.positions} positions, "
            f"{self.prompts} prompts), next-token distance mean {self.distance_mean:.3g}, max {self.distance_max:.3g}"
        )


def through_int8_cache(model: nn.Module, ids: torch.Tensor, start: int) -> torch.Tensor:
    """next_token_probabilities as the engine computes them on an int8 KV cache (cache.py): each
    position attends to the keys and values of those before it as the cache holds them."""
    dtype = next(model.parameters()).dtype
    cache = SlotCache(KvShape.of(model.config), 1, ids.shape[1], dtype, int8=True)
    logits = Runner(model, cache, ids.shape[1]).part(Part(0, tuple(ids[0].tolist()), 0, last=False), every=True)
    return logits[start:-1].float().softmax(-1)


@torch.no_grad()
def measure(model: nn.Module, reference: Reference, kv_cache: KvCache = KvCache.DTYPE) -> Agreement:
    """The served model's agreement with the float one's answers, through its KV cache's precision."""
    probabilities = through_int8_cache if kv_cache is KvCache.INT8 else next_token_probabilities
    equal, distances = 0, []
    for judged in reference.prompts:
        ours = probabilities(model, judged.ids, judged.start)
        equal += int((ours.argmax(-1) == judged.greedy).sum())
        distances.append(0.5 * (ours - judged.probabilities).abs().sum(-1))
    every = torch.cat(distances) if distances else torch.zeros(0)
    return Agreement(
        len(reference.prompts),
        reference.positions,
        equal,
        float(every.mean()) if every.numel() else 0.0,
        float(every.max()) if every.numel() else 0.0,
    )


@dataclasses.dataclass(frozen=True)
class AgreementLimits:
    min_match_rate: float  # of greedy tokens equal to the float model's
    max_distance_mean: float  # mean total variation distance of next-token distributions

    def failures(self, agreement: Agreement) -> list[str]:
        failures = []
        if not agreement.match_rate >= self.min_match_rate:
            failures.append(f"greedy tokens equal {agreement.match_rate:.1%} < {self.min_match_rate:.1%}")
        if not agreement.distance_mean <= self.max_distance_mean:  # NaN fails too
            failures.append(f"next-token distance mean {agreement.distance_mean:.3g} > {self.max_distance_mean:.3g}")
        return failures


# The limits per reduction of the served model; a model file's accuracy_min_match_rate and
# accuracy_tolerance replace them. float32 on float32 weights is not judged: compiled or not it
# computes what transformers does, up to summation order (the e2e tests compare its greedy
# answers token for token). bfloat16's are loose enough for its rounding on the tests' small
# models, whose peaked outputs make it show, and tight enough to refuse one of them with one
# layer's weights off by half their spread (tests/unit/handlers/generation/test_agreement.py).
# int8 weights round each weight to 1/254 of its channel's largest, coarser than bfloat16's
# 8 bits of mantissa: their limits are looser, pass the tests' small models on int8 weights and
# still refuse the one with a broken layer (the same tests).
# An int8 KV cache (a scale per head and position) was as close to float32's as bfloat16 compute
# on the tests' small models (tests/unit/handlers/generation/test_cache.py): bfloat16's limits.
# Pairs, not a dict: the reductions are string enums, and Weights.INT8 == KvCache.INT8 == "int8".
LIMITS: tuple[tuple[DType | Weights | KvCache, AgreementLimits], ...] = (
    (DType.BFLOAT16, AgreementLimits(min_match_rate=0.85, max_distance_mean=0.1)),
    (Weights.INT8, AgreementLimits(min_match_rate=0.8, max_distance_mean=0.15)),
    (KvCache.INT8, AgreementLimits(min_match_rate=0.85, max_distance_mean=0.1)),
)


def limits_of(reduced: DType | Weights | KvCache) -> AgreementLimits | None:
    """One reduction's default limits; None when it is none (float32, weights or KV in the dtype)."""
    return next((limits for key, limits in LIMITS if key is reduced), None)


def limits(settings: GenerationSettings) -> AgreementLimits | None:
    """What the served model must meet, or None when it is not judged. A model reduced twice
    (bfloat16 on int8 weights, or with an int8 KV cache) meets the loosest: its error is mostly
    the coarsest one's."""
    reductions = [r for r in map(limits_of, (settings.dtype, settings.weights, settings.kv_cache)) if r is not None]
    if not reductions:
        return None
    rate, distance = settings.accuracy_min_match_rate, settings.accuracy_tolerance
    return AgreementLimits(
        min(r.min_match_rate for r in reductions) if rate is None else rate,
        max(r.max_distance_mean for r in reductions) if distance is None else distance,
    )


def require(agreement: Agreement, limits: AgreementLimits, served: str) -> None:
    """AccuracyError naming what failed, when the served model is too far from the float one."""
    if failures := limits.failures(agreement):
        raise AccuracyError(
            f"{served} answers too far from the float model on held-out prompts: {'; '.join(failures)} "
            f"({agreement.summary()}); serve it in float32 on float weights (variant inductor), or give your own prompts (make model ... SAMPLES=) "
            "and limits (accuracy_min_match_rate, accuracy_tolerance in the model file's handler settings)"
        )
