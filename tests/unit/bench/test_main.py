"""bench/__main__.py: the exit status says whether a row the result depends on failed."""

from __future__ import annotations

import json

import pytest

from tests.unit.bench.rows import ENVIRONMENT, fake_rows, quick_plan_without_references


@pytest.mark.parametrize(
    "failing, lost",
    [
        ({("bert", "baseline")}, ["bert: the baseline row 'baseline' failed"]),
        (
            {("bert", "optimized"), ("bert", "fixed 2x1"), ("bert", "baseline")},
            ["bert: the baseline row 'baseline' failed", "bert: every served row failed"],
        ),
        ({("bert", "optimized"), ("resnet50", "fixed 2x1")}, []),
    ],
)
def test_the_run_fails_only_when_a_row_its_result_depends_on_failed(tmp_path, monkeypatch, failing, lost):
    import bench.__main__ as bench_main

    fake_rows(monkeypatch, failing)
    monkeypatch.setattr(bench_main, "load_plan", lambda name, models: quick_plan_without_references())
    monkeypatch.setattr(bench_main, "build_archives", lambda plan: True)
    monkeypatch.setattr(bench_main.RunEnvironment, "capture", classmethod(lambda cls: ENVIRONMENT))
    out = tmp_path / "run"
    assert bench_main.main(["--plan", "quick", "--out", str(out)]) == (1 if lost else 0)
    document = json.loads((out / "results.json").read_text())
    assert document["lost"] == lost
    assert {(f["model"], f["name"]) for f in document["failed"]} == failing
