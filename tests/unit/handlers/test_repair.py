"""handlers/repair.py: the greedy int8 repair, on a stand-in backend whose error is a function
of the operations kept in float (the real backends: tests/unit/handlers/test_precompiled.py)."""

from __future__ import annotations

import torch

from handlers.accuracy import Answer, Validation
from handlers.repair import Quantizer, repaired_if_needed

# What each group costs while it stays in int8: the answer is off by the sum of what remains.
COSTS = {"ffn_up": 0.5, "attention": 0.05, "ffn_down": 0.02, "head": 0.3}


def validation(limit: float) -> Validation:
    return Validation([(torch.ones(1, 2),)], [torch.ones(1, 2)], Answer.VALUES, limit)


def stand_in(costs: dict[str, float] = COSTS, interaction: float = 0.0) -> tuple[Quantizer, list[tuple[str, ...]]]:
    quantized: list[tuple[str, ...]] = []

    def quantize(in_float):
        quantized.append(tuple(in_float))
        error = sum(cost for name, cost in costs.items() if name not in in_float) + interaction * len(in_float)
        return frozenset(in_float), error

    def runner(model):
        return lambda x: x * (1 + model[1])  # relative error of the answer = the model's error

    return Quantizer([[name] for name in costs], quantize, runner), quantized


def test_the_costliest_groups_go_to_float_until_the_target_is_met():
    quantizer, quantized = stand_in()
    plain = quantizer.quantize([])
    repaired = repaired_if_needed(plain, quantizer, validation(limit=0.2), print)
    # 0.87 in int8; the target is 3/4 of 0.2 = 0.15: ffn_up (0.37 left), then head (0.07 left).
    assert repaired[0] == {"ffn_up", "head"} and abs(repaired[1] - 0.07) < 1e-9
    assert len(quantized) == 1 + 4 + 3  # the plain one, then a trial per group still in int8, twice


def test_a_build_within_the_target_is_left_as_it_is():
    quantizer, quantized = stand_in({"attention": 0.05})
    plain = quantizer.quantize([])
    assert repaired_if_needed(plain, quantizer, validation(limit=0.2), print) is plain
    assert len(quantized) == 1  # nothing tried


def test_when_keeping_more_in_float_gains_nothing_the_plain_build_is_judged(capsys):
    # Every group kept in float costs more than it saves (a backend whose float fallback is worse).
    quantizer, _ = stand_in({"a": 0.1, "b": 0.1}, interaction=0.5)
    plain = quantizer.quantize([])
    assert repaired_if_needed(plain, quantizer, validation(limit=0.1), print) is plain
    assert "gained nothing" in capsys.readouterr().out


def test_the_first_smallest_group_that_meets_the_target_ends_the_search():
    # The head alone brings 0.37 down to 0.07, within the target 0.15: tried first as the smallest
    # group, nothing after it is quantized.
    costs = {"ffn": 0.02, "head": 0.3, "attention": 0.05}
    quantized: list[tuple[str, ...]] = []

    def quantize(in_float):
        quantized.append(tuple(in_float))
        return frozenset(in_float), sum(cost for name, cost in costs.items() if name not in in_float)

    quantizer = Quantizer(
        [["ffn.0", "ffn"], ["head"], ["attention.0", "attention"]], quantize, lambda m: lambda x: x * (1 + m[1])
    )
    plain = quantizer.quantize([])
    repaired = repaired_if_needed(plain, quantizer, validation(limit=0.2), print)
    assert repaired[0] == {"head"} and abs(repaired[1] - 0.07) < 1e-9
    assert quantized == [(), ("head",)]
