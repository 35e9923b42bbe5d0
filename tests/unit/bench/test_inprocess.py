"""bench/inprocess.py: a measuring process gets the environment the server gives the model's workers."""

from __future__ import annotations

import pytest

from bench import inprocess
from kit.layout import OmpWaitPolicy
from kit.serve_config import ServeConfig


@pytest.mark.parametrize(
    ("own", "expected"),
    [
        (None, "PASSIVE"),  # no policy of its own: the preset's
        (OmpWaitPolicy.DEFAULT, None),  # libgomp's own: unset, as kit/pin_worker.py leaves it
        (OmpWaitPolicy.ACTIVE, "ACTIVE"),
    ],
)
def test_a_models_own_openmp_wait_policy_wins_over_the_presets(monkeypatch, own, expected):
    monkeypatch.setattr(inprocess, "omp_wait_policy", lambda model: own)
    config = ServeConfig.from_preset("optimized", models=["bert"])
    assert config.omp_wait_policy is OmpWaitPolicy.PASSIVE
    environment = inprocess.child_environment(config, 3, "bert")
    assert environment.get("OMP_WAIT_POLICY") == expected
    assert environment["OMP_NUM_THREADS"] == "3"


def test_the_float32_eager_archive_is_the_reference_itself_and_others_are_measured(monkeypatch):
    from handlers.backends import Backend, DType
    from handlers.settings import OptimizationSettings

    measured = []
    monkeypatch.setattr(
        "handlers.accuracy.agreement", lambda run, reference, held_out: measured.append(run) or "measured"
    )
    eager = OptimizationSettings(backend=Backend.EAGER)
    exact = inprocess.judged(eager, "eager", "reference", ["input"])
    assert (exact.cosine_mean, exact.cosine_min, exact.top1_agreement, exact.probability_diff_max) == (1, 1, 1, 0)
    assert measured == []
    assert (
        inprocess.judged(OptimizationSettings(backend=Backend.INDUCTOR), "compiled", "reference", ["input"])
        == "measured"
    )
    bf16 = OptimizationSettings(backend=Backend.EAGER, dtype=DType.BFLOAT16)
    assert inprocess.judged(bf16, "eager bf16", "reference", ["input"]) == "measured"
    assert measured == ["compiled", "eager bf16"]
