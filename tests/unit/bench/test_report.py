"""bench/report.py: report.md, results.json and the charts of a run."""

from __future__ import annotations

import json

import pytest

from bench.plan import load_plan
from bench.report import write_report
from bench.results import BenchRun, add_derived
from bench.targets import check_targets
from tests.unit.bench.rows import ENVIRONMENT, row_result


def test_report_files_speedups_and_targets(tmp_path):
    results = [
        row_result(name="baseline", baseline=True, requests_per_s=2.0, items_per_s=2.0),
        row_result(name="optimized", requests_per_s=24.0, items_per_s=24.0, in_process_items_per_s=28.0),
        row_result(model="bert", name="baseline", baseline=True, requests_per_s=5.0, items_per_s=5.0),
        row_result(model="bert", name="optimized", requests_per_s=9.0, items_per_s=9.0, non_2xx=2),
    ]
    add_derived(results)
    assert results[1].speedup_vs_baseline == 12.0
    assert results[1].served_vs_in_process == pytest.approx(0.857, abs=1e-3)
    checks = {c.target: c for c in check_targets(results)}
    assert checks["resnet50: best row >= 3.0x baseline req/s"].met
    assert not checks["resnet50: best row served >= 90% of in-process"].met
    assert "short by 4%" in checks["resnet50: best row served >= 90% of in-process"].measured
    assert not checks["zero non-2xx responses in every row"].met
    # bert's best *healthy* row is its baseline (the optimized row had errors): 1.0x, short by 1.0x.
    assert "short by 1.00x" in checks["bert: best row >= 2.0x baseline req/s"].measured

    out = tmp_path / "results" / "20260101-000000"
    write_report(out, BenchRun(load_plan("quick"), "python -m bench --plan quick", ENVIRONMENT, results))
    document = json.loads((out / "results.json").read_text())
    assert document["environment"]["cores"] == 2
    required = {
        "model",
        "name",
        "runtime",
        "precompiled",
        "placement",
        "cpu_busy",
        "allocator",
        "workers",
        "threads",
        "batch_size",
        "concurrency",
        "requests_per_s",
        "items_per_s",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "non_2xx",
        "speedup_vs_baseline",
        "in_process_items_per_s",
        "allocator_loaded",
        "ab_command",
    }
    assert required <= set(document["rows"][0])
    report = (out / "report.md").read_text()
    assert "| **baseline** |" in report and "12.00×" in report and "| **no** |" in report
    assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    assert (out.parent / "latest").resolve() == out.resolve()


def test_report_breaks_down_cpu_per_request(tmp_path):
    results = [row_result(cpu_ms_per_request={"frontend": 4.9, "workers": 11.2, "ab": 0.6})]
    out = tmp_path / "results" / "run"
    write_report(out, BenchRun(load_plan("quick"), "python -m bench --plan quick", ENVIRONMENT, results))
    report = (out / "report.md").read_text()
    assert "## CPU per request" in report
    assert "| resnet50 | row | 0.6 | 4.9 | 11.2 | 16.7 |" in report
    assert (out / "cpu_per_request.png").read_bytes()[:4] == b"\x89PNG"
