"""handlers/generation/sampling.py: parameters checked by name; the choice follows them."""

from __future__ import annotations

import pytest
import torch

from handlers.generation.sampling import Sampling
from handlers.payload import InvalidInput

DEFAULTS = Sampling(temperature=0.7, top_p=0.9, top_k=40)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"temperature": "hot"}, "temperature must be a number from 0.0 to 100.0, got 'hot'"),
        ({"temperature": -1}, "temperature must be from 0.0 to 100.0, got -1"),
        ({"top_p": 1.5}, "top_p must be from 0.0 to 1.0, got 1.5"),
        ({"top_k": 2.5}, "top_k must be a whole number from 0 to 2147483647, got 2.5"),
        ({"top_k": True}, "top_k must be a whole number"),
        ({"seed": -3}, "seed must be from 0 to"),
        ({"temperature": float("nan")}, "temperature must be a number"),
    ],
)
def test_a_wrong_parameter_is_refused_by_name(body, message):
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(".", r"\.")):
        Sampling.parse(body, DEFAULTS)


def test_the_models_defaults_fill_what_a_request_leaves_out():
    assert Sampling.parse({"seed": 3}, DEFAULTS) == Sampling(0.7, 0.9, 40, 3)
    assert Sampling.parse({"temperature": 0}, DEFAULTS).greedy


def test_greedy_takes_the_likeliest_and_a_narrow_top_k_or_top_p_leaves_only_it():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert Sampling().choose(logits, None) == 1
    for narrow in (Sampling(temperature=5.0, top_k=1, seed=0), Sampling(temperature=5.0, top_p=0.01, seed=0)):
        draws = {narrow.choose(logits, narrow.generator()) for _ in range(20)}
        assert draws == {1}


def test_top_p_keeps_the_smallest_set_holding_p_of_the_probability():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    sampling = Sampling(temperature=1.0, top_p=0.75, seed=0)
    generator = sampling.generator()
    draws = {sampling.choose(logits, generator) for _ in range(300)}
    assert draws == {0, 1}  # 0.5 + 0.3 reach 0.75; 0.15 and 0.05 are cut


def test_the_same_seed_draws_the_same_tokens():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    sampling = Sampling(temperature=1.0, seed=42)
    first, second = sampling.generator(), sampling.generator()
    assert [sampling.choose(logits, first) for _ in range(10)] == [sampling.choose(logits, second) for _ in range(10)]
