"""bench/runner.py: rows skipped, failed or measured, and ITT counts settled, without a server."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from bench import runner
from bench.plan import load_plan, parse_plan
from bench.report import write_report
from bench.results import BenchRun
from handlers.backends import DType
from kit.variant import Variant
from tests.unit.bench.rows import ENVIRONMENT, fake_rows, quick_plan_without_references


def test_rows_without_their_environment_are_skipped_and_reported(tmp_path, monkeypatch):
    from bench.runner import run_plan
    from kit.variant import Variant

    monkeypatch.setattr(Variant, "environment", property(lambda variant: tmp_path / ".venv-ipex"))
    monkeypatch.setattr("bench.runner.run_row", lambda *args: pytest.fail("a row without its venv was started"))
    plan = load_plan("default")
    ipex_rows = [row for row in plan.rows if row.serve.variant.name == "ipex"]
    assert ipex_rows, "the default plan has IPEX rows"
    plan = dataclasses.replace(plan, rows=ipex_rows, peers=(), served_peers=())
    run = BenchRun(plan, "python -m bench", ENVIRONMENT)
    run_plan(run, tmp_path)
    assert run.results == [] and len(run.skipped) == len(ipex_rows)
    assert ".venv-ipex is not built (`make install-ipex`)" in run.skipped[0]
    write_report(tmp_path / "out", run)
    assert "## Skipped rows" in (tmp_path / "out" / "report.md").read_text()
    assert json.loads((tmp_path / "out" / "results.json").read_text())["skipped"] == run.skipped


@pytest.mark.parametrize(
    ("flags", "skipped"), [("avx2 avx512f avx512_vnni", True), ("avx2 avx512f avx512_bf16", False)]
)
def test_bf16_rows_are_skipped_with_the_reason_on_a_cpu_without_bf16(tmp_path, monkeypatch, flags, skipped):
    from bench.runner import run_plan

    monkeypatch.setattr("handlers.backends.cpu_flags", lambda: frozenset(flags.split()))
    started = []

    def measure_row(row, *args):
        started.append(row.name)
        raise RuntimeError("not measured in a unit test")  # recorded as the row's failure

    monkeypatch.setattr("bench.runner.measure_row", measure_row)
    plan = parse_plan("t", {"models": ["bert"], "rows": [{"name": "bf16", "variant": "openvino-bf16"}]})
    assert Variant.load("openvino-bf16").dtype is DType.BFLOAT16
    run = BenchRun(plan, "python -m bench", ENVIRONMENT)
    run_plan(run, tmp_path)
    if skipped:
        assert started == [] and len(run.skipped) == 1
        assert "dtype bfloat16 needs a CPU with AMX_BF16 or AVX512_BF16; this one has neither" in run.skipped[0]
    else:
        assert started == ["bf16"] and run.skipped == []


def test_a_failing_row_is_recorded_with_its_reason_and_the_run_goes_on(tmp_path, monkeypatch):
    from bench.runner import run_plan

    fake_rows(monkeypatch, failing={("resnet50", "optimized")})
    run = BenchRun(quick_plan_without_references(), "python -m bench --plan quick", ENVIRONMENT)
    run_plan(run, tmp_path)
    assert [(r.model, r.name) for r in run.results] == [
        ("resnet50", "baseline"),
        ("resnet50", "fixed 2x1"),
        ("bert", "baseline"),
        ("bert", "optimized"),
        ("bert", "fixed 2x1"),
    ]
    (failure,) = run.failed
    assert (failure.model, failure.name, failure.kind, failure.baseline) == ("resnet50", "optimized", "served", False)
    assert (
        failure.reason
        == "ServerError: TorchServe exited during start-up: Unrecognized VM option 'X'; see torchserve.out"
    )
    assert failure.log == str(tmp_path / "servers" / "resnet50-optimized")
    assert run.lost() == []  # the comparison still has its baselines and a row of every model
    write_report(tmp_path / "out", run)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Failed rows" in report and "| resnet50 | optimized | ServerError: TorchServe exited" in report
    document = json.loads((tmp_path / "out" / "results.json").read_text())
    assert document["failed"] == [dataclasses.asdict(failure)] and document["lost"] == []


def counts(*values: int):
    """A count that takes these values at successive reads, then keeps the last."""
    seen = iter(values)
    last = [values[0]]

    def read(*_args) -> int:
        last[0] = next(seen, last[0])
        return last[0]

    return read


def test_itt_ranges_and_the_frontend_settle_on_a_request_counted_after_ab(monkeypatch, tmp_path):
    """ab exits with a request unread in its socket: the frontend counts it, then a worker answers it."""
    monkeypatch.setattr(runner, "model_ranges", lambda itt_dir, model: [])
    monkeypatch.setattr(runner, "covered", counts(730, 730, 730, 731))
    monkeypatch.setattr(runner, "ITT_AGREE_S", 0.2)
    # The first reads agree (730): the late request is not read yet. Taken then, ranges would be 731.
    assert runner.settle_itt(tmp_path, "m", counts(730, 730, 731)) == 731


def test_itt_counts_that_disagree_and_stay_still_are_reported_as_they_are(monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "model_ranges", lambda itt_dir, model: [])
    monkeypatch.setattr(runner, "covered", counts(5))  # a request the frontend counted and no worker ran
    monkeypatch.setattr(runner, "ITT_STILL_S", 0.3)
    started = time.monotonic()
    assert runner.settle_itt(tmp_path, "m", counts(6)) == 6
    assert time.monotonic() - started < runner.ITT_DRAIN_S / 2  # not the whole drain deadline
