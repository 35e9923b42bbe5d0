"""The soak's arithmetic and checks on made-up samples and logs (no server)."""

from __future__ import annotations

import dataclasses

import pytest

from bench.soak.load import NO_RESPONSE, Sample
from bench.soak.report import KillPhase, RestartPhase, SoakPhase, SoakSettings, WorkerMemory, evaluate
from bench.soak.run import WINDOW_S, full_rate_after, recovered_rates, served_backends, steady_rate


def steady(start: float, end: float, rate: float) -> list[Sample]:
    count = int((end - start) * rate)
    return [Sample("m", start + i / rate, start + (i + 0.5) / rate, 200) for i in range(count)]


def test_full_rate_returns_when_the_rate_does():
    # 20 req/s, then 10 req/s for 8 s after the kill at t=10, then 20 req/s again.
    samples = steady(0, 10, 20) + steady(10, 18, 10) + steady(18, 30, 20)
    assert full_rate_after(samples, killed_at=10, end=30, rate_before=20) == pytest.approx(8.0, abs=0.6)
    assert full_rate_after(steady(0, 10, 20) + steady(10, 30, 10), 10, 30, 20) is None


def test_a_steady_rate_leaves_out_the_first_window_after_its_start():
    # A replacement's first window at half the rate, then 20 req/s: its steady rate is 20.
    samples = steady(0, WINDOW_S, 10) + steady(WINDOW_S, 10, 20)
    assert steady_rate(samples, start=0, end=10) == pytest.approx(20, rel=0.05)
    assert steady_rate(steady(0, 10, 20), start=0, end=10) == pytest.approx(20, rel=0.05)


def recovery(samples: list[Sample], rate_before: float) -> tuple[list[float], float]:
    """recovered_rates from READY at t=0, on a clock that moves by each window slept."""
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    settings = SoakSettings(models=("m",), after_recovery_s=10, recovery_windows=3)
    return recovered_rates(lambda: samples, 0.0, rate_before, settings, sleep, lambda: now[0])


def test_recovery_is_measured_until_a_window_is_back_at_the_fraction_and_no_further():
    # The host slowed the first window (12 req/s of 20); the second is back: two windows, not three.
    rates, end = recovery(steady(0, 10, 12) + steady(10, 30, 20), rate_before=20)
    assert rates == pytest.approx([12, 20], rel=0.05) and end == 20
    assert recovery(steady(0, 30, 20), rate_before=20) == (pytest.approx([20], rel=0.05), 10)


def test_a_replacement_that_never_serves_at_the_fraction_fails_every_window():
    rates, end = recovery(steady(0, 30, 10), rate_before=20)
    assert rates == pytest.approx([10, 10, 10], rel=0.05) and end == 30


def test_served_backends_read_the_ready_lines(tmp_path):
    log = tmp_path / "model_log.log"
    log.write_text(
        "... MODEL_LOG - resnet50 ready: backend=inductor load=0.5s compile=5.1s warmup=0.3s\n"
        "... MODEL_LOG - bert ready: backend=eager load=0.5s compile=0.1s warmup=0.3s\n"
    )
    assert served_backends(log) == {"inductor", "eager"}
    assert served_backends(tmp_path / "missing.log") == set()


def phases(**changes):
    soak = SoakPhase(20, 400, 20.0, 0, 0, 300, 400, 450, [], [WorkerMemory("resnet50", 1, 600, 601, 602)])
    kill = KillPhase("resnet50", 1, 3, 600, 1, 0, ["t+0.0s 500 Worker died."], 15, 15, 21, 21, [21], [0], [1], [0])
    restart = RestartPhase(18, 13, 19, 0, {"resnet50/9000": 13}, True, {"resnet50": 200})
    parts = {"soak": soak, "kill": kill, "restart": restart}
    for key, value in changes.items():
        phase, field = key.split("__")
        parts[phase] = dataclasses.replace(parts[phase], **{field: value})
    return parts


def failing(**changes) -> list[str]:
    parts = phases(**changes)
    return [c.name for c in evaluate(SoakSettings(), parts["soak"], parts["kill"], parts["restart"]) if not c.passed]


def test_a_healthy_run_passes_every_check():
    assert failing() == []
    # A model served by one worker (a memory budget's plan): its replacement takes the same cores.
    assert failing(kill__sibling_cpus=[], kill__killed_cpus=[0, 1], kill__replacement_cpus=[0, 1]) == []


@pytest.mark.parametrize(
    ("change", "check"),
    [
        ({"soak__non_2xx": 1}, "soak: every request answered 2xx"),
        ({"soak__replaced_workers": ["resnet50/9000"]}, "soak: no worker replaced"),
        ({"soak__memory": [WorkerMemory("resnet50", 1, 600, 700, 700)]}, "soak: worker RSS growth <= 64 MB"),
        ({"kill__no_response": 1}, "kill: no request hung or dropped"),
        ({"kill__replacement_cpus": [1]}, "kill: replacement pinned to the freed core"),
        ({"kill__replacement_cpus": [0, 1]}, "kill: replacement pinned to the freed core"),
        ({"kill__rate_after": 10}, "kill: throughput back to >= 85%"),
        ({"restart__answered": {"resnet50": 503}}, "restart: every model answers"),
        ({"restart__restart_new_kernels": 1}, "restart: kernels loaded from the cache, none compiled again"),
        (
            {"restart__cached_kernels_mapped": {"resnet50/9000": 0}},
            "restart: kernels loaded from the cache, none compiled again",
        ),
    ],
)
def test_each_failure_fails_its_check(change, check):
    assert failing(**change) == [check]


def test_kill_model_must_be_served():
    from handlers.typed_config import SettingsError

    with pytest.raises(SettingsError, match="kill_model 'bert' is not among"):
        SoakSettings(models=("resnet50",), kill_model="bert")


def test_unanswered_sample_is_not_ok():
    assert not Sample("m", 0, 1, NO_RESPONSE, "ReadTimeout").ok


def test_the_command_line_reads_its_options(monkeypatch, tmp_path):
    import bench.soak.run

    ran = []
    monkeypatch.setattr(bench.soak.run, "run_soak", lambda settings, out_dir: ran.append(settings) or 1 / 0)
    with pytest.raises(ZeroDivisionError):  # got as far as running, with the options read
        bench.soak.run.main(["--seconds", "7", "--out", str(tmp_path)])
    assert ran[0].seconds == 7 and ran[0].models == SoakSettings().models  # default: every model
    with pytest.raises(ZeroDivisionError):
        bench.soak.run.main(["--models", "resnet50", "--out", str(tmp_path)])
    assert ran[1].models == ("resnet50",)
