"""bench/versus/rounds.py and bench/versus/report.py: interleaved rounds, medians, spreads and verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.plan import PlanError, load_plan, parse_plan
from bench.results import BenchRun, RowFailure, RowResult
from bench.versus.report import compare, summarize_entries, write_versus_report
from bench.versus.rounds import Entry, entries, run_rounds
from tests.unit.bench.rows import ENVIRONMENT, row_result


def rounds(kind: str, name: str, speeds: list[float], concurrency: int = 4, **fields) -> list:
    return [
        row_result(kind=kind, name=name, requests_per_s=s, items_per_s=s, concurrency=concurrency, round=i, **fields)
        for i, s in enumerate(speeds, start=1)
    ]


def test_a_summary_is_the_median_and_spread_of_its_rounds():
    stages = {"model": {"ms_per_request": 9.0}, "decode": {"ms_per_request": 3.0}}
    (summary,) = summarize_entries(rounds("served", "kit", [100.0, 130.0, 120.0], stages=stages))
    assert (summary.rounds, summary.requests_per_s) == (3, 120.0)
    assert (summary.requests_per_s_min, summary.requests_per_s_max) == (100.0, 130.0)
    assert summary.spread == pytest.approx(0.25)
    assert summary.stage_ms_per_request == {"decode": 3.0, "model": 9.0}


@pytest.mark.parametrize(
    ("kit", "peer", "expected"),
    [
        ([130, 135, 140], [100, 110, 120], "ahead"),  # every kit round beat every peer round
        ([90, 95, 100], [100.5, 110, 120], "behind"),
        ([100, 140, 141], [120, 125, 130], "level"),  # the kit's median is higher, but the spreads overlap
    ],
)
def test_ahead_and_behind_only_where_the_spreads_do_not_overlap(kit, peer, expected):
    summaries = summarize_entries(rounds("served", "kit", kit) + rounds("served_peer", "fastapi", peer))
    (verdict,) = compare(summaries)
    assert verdict.verdict == expected
    assert verdict.ratio == pytest.approx(sorted(kit)[1] / sorted(peer)[1], abs=0.01)


def test_the_best_of_each_side_is_compared_per_precision_and_concurrency():
    results = (
        rounds("served", "kit slow", [50, 50])
        + rounds("served", "kit fast", [90, 92])
        + rounds("served_peer", "fastapi", [80, 81])
        + rounds("served", "kit batch", [150, 151], concurrency=16)
        + rounds("served_peer", "litserve", [140, 160], concurrency=16)
        + rounds("served", "kit only", [10, 10], model="bert")  # no peer for bert: no verdict
        + rounds("served", "kit itt", [500, 500], itt_ranges=1000)  # the trace's cost: no contender
    )
    results += rounds("served", "kit int8", [300, 300], precision="int8")  # no int8 peer: no verdict for it
    verdicts = {
        (v.model, v.precision, v.concurrency): (v.kit, v.peer, v.verdict) for v in compare(summarize_entries(results))
    }
    assert verdicts == {
        ("resnet50", "float32", 4): ("kit fast", "fastapi", "ahead"),
        ("resnet50", "float32", 16): ("kit batch", "litserve", "level"),
    }


def test_the_report_names_cpu_commit_medians_and_verdicts(tmp_path):
    plan = load_plan("versus", ["resnet50"])
    kit_stages = {
        "decode": {"ms_per_request": 3.1, "cpu_ms_per_request": 2.9},
        "model": {"ms_per_request": 9.5, "cpu_ms_per_request": 6.5},
    }
    results = rounds(
        "served",
        "openvino-int8 plan",
        [120.0, 125.0],
        precision="int8",
        stages=kit_stages,
        cpu_ms_per_request={"frontend": 0.7, "frontend JIT": 0.1, "workers": 12.2, "ab": 0.5},
    )
    results += rounds(
        "served_peer",
        "fastapi openvino int8 b1 c=4",
        [150.0, 152.0],
        precision="int8",
        stages={"model": {"ms_per_request": 6.0, "cpu_ms_per_request": 6.0}},
        cpu_ms_per_request={"peer server": 9.5, "ab": 0.5},
    )
    write_versus_report(tmp_path, BenchRun(plan, "python -m bench --plan versus", ENVIRONMENT, results))
    report = (tmp_path / "report.md").read_text()
    assert ENVIRONMENT.cpu_model in report and ENVIRONMENT.git_commit in report
    assert "| resnet50 | kit | openvino-int8 plan | 4 | 122.5 | 120.0–125.0 (4%) |" in report
    assert "frontend 0.7, frontend JIT 0.1, workers 12.2" in report
    # Wall / CPU per stage on both sides; `all` adds up the call's stages.
    assert "| resnet50 | kit | openvino-int8 plan | 3.10 / 2.90 | 9.50 / 6.50 | 12.60 / 9.40 |" in report
    assert "| resnet50 | peer | fastapi openvino int8 b1 c=4 | – | 6.00 / 6.00 | 6.00 / 6.00 |" in report
    # Outside the model call: the workers' 12.2 - 6.5, the frontend's 0.8; ab is not the server's.
    assert "| resnet50 | kit | openvino-int8 plan | 6.50 | 2.90 | 5.70 | 0.80 | 6.50 |" in report
    assert "| resnet50 | peer | fastapi openvino int8 b1 c=4 | 6.00 | 0.00 | 3.50 | 0.00 | 3.50 |" in report
    assert "| resnet50 | int8 | 4 | openvino-int8 plan | fastapi openvino int8 b1 c=4 | 0.81× | behind |" in report
    document = json.loads((tmp_path / "results.json").read_text())
    assert len(document["rows"]) == 4 and document["verdicts"][0]["verdict"] == "behind"
    assert document["outside_model"]["resnet50/openvino-int8 plan"]["serving_process"] == pytest.approx(5.7)


def test_rounds_alternate_the_order_and_number_each_result(tmp_path, monkeypatch):
    plan = parse_plan("p", {"models": ["resnet50"], "rounds": 3, "rows": [{"name": "a"}]})
    run = BenchRun(plan, "cmd", ENVIRONMENT)
    order: list[str] = []

    def entry(label: str) -> Entry:
        failure = RowFailure("resnet50", label, "served", False, "", "")

        def measure(out_dir: Path) -> RowResult:
            order.append(label)
            return row_result(name=label)

        return Entry(label, failure, measure, lambda round_dir: round_dir / label)

    monkeypatch.setattr("bench.versus.rounds.entries", lambda run: [entry("kit a"), entry("kit b"), entry("peer")])
    run_rounds(run, tmp_path)
    assert order == ["kit a", "kit b", "peer", "peer", "kit b", "kit a", "kit a", "kit b", "peer"]
    assert [r.round for r in run.results] == [1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_a_plan_sets_rounds_warm_up_seconds_and_a_rows_itt():
    plan = parse_plan(
        "p",
        {
            "models": ["resnet50"],
            "rounds": 2,
            "warmup_seconds": 30,
            "itt": False,
            "rows": [{"name": "a"}, {"name": "b", "itt": True}],
        },
    )
    assert (plan.run.rounds, plan.run.warmup_seconds) == (2, 30)
    assert [r.records_itt(plan.run) for r in plan.rows] == [False, True]
    with pytest.raises(PlanError, match="itt must be true or false, got 'yes'"):
        parse_plan("p", {"models": ["resnet50"], "rows": [{"name": "a", "itt": "yes"}]})
    with pytest.raises(PlanError, match="rounds >= 1"):
        parse_plan("p", {"models": ["resnet50"], "rounds": 0, "rows": [{"name": "a"}]})


def test_entries_skip_what_this_machine_cannot_run_with_the_reason(monkeypatch):
    plan = load_plan("versus", ["resnet50"])
    monkeypatch.setattr(
        "bench.versus.rounds.missing_environment", lambda row: "bf16 needs AMX" if "bf16" in row.name else ""
    )
    run = BenchRun(plan, "cmd", ENVIRONMENT)
    made = entries(run)
    labels = [e.label for e in made]
    by_label = {e.label: e for e in made}
    round_dir = Path("/r")
    assert by_label["resnet50 / fastapi openvino int8 b1 c=4"].log(round_dir).parent == round_dir / "servers"
    assert (
        by_label["resnet50 / openvino-int8 plan"].log(round_dir)
        == round_dir / "servers" / "resnet50-openvino-int8-plan"
    )
    assert not [label for label in labels if "bf16 plan" in label]
    assert any("bf16 needs AMX" in reason for reason in run.skipped)
    assert "resnet50 / fastapi openvino int8 b1 c=4" in labels
