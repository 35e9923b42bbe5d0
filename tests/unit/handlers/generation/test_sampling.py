"""handlers/generation/sampling.py: parameters checked by name; the choice follows them."""

from __future__ import annotations

import pytest
import torch

from handlers.generation.sampling import ARGMAX_CHUNK, Sampling, first_argmax
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


@pytest.mark.parametrize("size", [1, ARGMAX_CHUNK - 1, ARGMAX_CHUNK, 3 * ARGMAX_CHUNK, 151_936])
def test_the_first_argmax_is_atens_with_ties_nans_and_a_partial_last_chunk(size):
    generator = torch.Generator().manual_seed(size)
    rows = [torch.randn(size, generator=generator) for _ in range(20)]
    rows.append(torch.zeros(size))  # every token tied: the first
    late = torch.randn(size, generator=generator)
    late[-1] = 1e9  # the largest in the partial last chunk
    rows.append(late)
    tie = torch.randn(size, generator=generator)
    tie[size // 3] = tie[-1] = 1e9  # tied across chunks: the earlier
    rows.append(tie)
    nan = torch.randn(size, generator=generator)
    nan[size // 2] = 1e9
    nan[-1] = nan[size // 5] = float("nan")  # a NaN is aten's largest, the first of them
    rows.append(nan)
    for row in rows:
        assert first_argmax(row) == int(row.argmax())


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


def test_the_repetition_penalty_is_transformers():
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    prompt, tokens = [3, 7, 7, 12], [12, 40]
    want = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + tokens]), logits[None].clone())[0]
    assert torch.equal(Sampling(repetition_penalty=1.3).adjusted(logits, prompt, tokens), want)


def test_presence_and_frequency_penalties_count_the_answers_tokens_only():
    logits = torch.zeros(6)
    sampling = Sampling(presence_penalty=0.5, frequency_penalty=0.25)
    adjusted = sampling.adjusted(logits, prompt=[1, 1, 5], tokens=[2, 2, 2, 3])
    assert adjusted.tolist() == [0.0, 0.0, -(0.5 + 3 * 0.25), -(0.5 + 0.25), 0.0, 0.0]
    assert logits.tolist() == [0.0] * 6  # the row itself is left as it was


def test_a_logit_bias_moves_greedy_and_is_checked_by_name():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    biased = Sampling.parse({"logit_bias": {"1": -100, "3": 5}}, Sampling(), vocabulary=4)
    assert biased.logit_bias == ((1, -100.0), (3, 5.0)) and biased.choose(logits, None) == 3
    for bias, message in [
        ({"4": 1}, r"logit_bias: '4' is not a token id of this model \(0 to 3\)"),
        ({"x": 1}, "logit_bias: 'x' is not a token id"),
        ({"1": 101}, r'logit_bias\["1"\] must be from -100.0 to 100.0, got 101'),
        ([1], "logit_bias must be an object"),
    ]:
        with pytest.raises(InvalidInput, match=message):
            Sampling.parse({"logit_bias": bias}, Sampling(), vocabulary=4)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"presence_penalty": 3}, "presence_penalty must be from -2.0 to 2.0, got 3"),
        ({"frequency_penalty": "x"}, "frequency_penalty must be a number"),
        ({"repetition_penalty": 0}, r"repetition_penalty must be above 0 \(1: none\), got 0"),
    ],
)
def test_a_wrong_penalty_is_refused_by_name(body, message):
    with pytest.raises(InvalidInput, match=message):
        Sampling.parse(body, Sampling())
