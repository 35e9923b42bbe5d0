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
