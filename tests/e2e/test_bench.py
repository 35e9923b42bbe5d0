"""`python -m bench` end to end on a tiny plan: real servers, real ab, every output file."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from bench.__main__ import main

# A row of the plan is served from .venv-ipex: this module runs in make test-ipex.
pytestmark = [pytest.mark.e2e, pytest.mark.ipex]

TINY_PLAN = {
    "description": "two configurations of the smallest model, a few seconds each",
    "seconds": 3,
    "warmup_requests": 2,
    "in_process_seconds": 2,
    "concurrency": 2,
    "models": ["minilm"],
    "rows": [
        {"name": "baseline", "preset": "baseline", "baseline": True},
        # Precompiled: Inductor's compile (~100 s of this test, server and in-process) is tested elsewhere.
        {"name": "optimized", "preset": "optimized", "variant": "aoti-int8"},
        # Deliberately broken: the JVM refuses the option and TorchServe exits at start.
        {"name": "broken", "preset": "optimized", "frontend_jvm_args": "-XX:+NoSuchOption"},
        {"name": "ipex", "preset": "optimized", "variant": "ipex"},  # served from .venv-ipex
        {"name": "openvino-int8", "preset": "optimized", "variant": "openvino-int8"},  # precompiled
        {"name": "openvino-int8 long", "preset": "optimized", "variant": "openvino-int8", "payload": "long"},
    ],
    "peers": [{"runtime": "openvino", "precision": "int8"}],
    "served_peers": [
        {"framework": "fastapi", "precision": "int8"},
        {"framework": "litserve", "precision": "int8", "batch_size": 2},
    ],
}


def test_tiny_plan_produces_report_json_and_chart(tmp_path):
    plan = tmp_path / "tiny.yaml"
    plan.write_text(yaml.safe_dump(TINY_PLAN))
    out = tmp_path / "results" / "run"
    assert main(["--plan", str(plan), "--out", str(out)]) == 0  # the broken row is not one the result needs

    document = json.loads((out / "results.json").read_text())
    (failed,) = document["failed"]
    assert (failed["model"], failed["name"], failed["kind"]) == ("minilm", "broken", "served")
    assert failed["reason"].startswith("ServerError: TorchServe exited during start-up: Unrecognized VM option")
    assert "NoSuchOption" in (out / "servers" / "minilm-broken" / "torchserve.out").read_text()
    assert document["lost"] == []
    assert document["environment"]["cores"] >= 1 and document["environment"]["torch"].startswith("2.13")
    served = [r for r in document["rows"] if r["kind"] == "served"]
    baseline, optimized, ipex, int8, long = served
    assert [r["name"] for r in served] == ["baseline", "optimized", "ipex", "openvino-int8", "openvino-int8 long"]
    assert [r["payload"] for r in served] == ["typical"] * 4 + ["long"]
    assert document["skipped"] == []
    for row in served:
        assert row["complete"] > 0 and row["requests_per_s"] > 0
        assert row["non_2xx"] == 0 and row["failed"] == 0
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
        assert row["in_process_items_per_s"] > 0
        assert row["ab_command"].startswith("ab -k ")
        # Where its CPU went, from /proc: the frontend, the model's workers and ab all did work.
        cpu = row["cpu_ms_per_request"]
        assert cpu["frontend"] > 0 and cpu["workers"] > 0 and cpu["ab"] > 0, cpu
        # One ITT range per inference call in the workers, covering every request answered.
        assert row["itt_ranges"] > 0 and row["itt_requests"] == row["requests_answered"] >= row["complete"], row
        # Memory from /proc of each worker: PSS never above RSS (shared pages divided among workers).
        assert len(row["worker_pss_mb"]) == row["worker_count"]
        assert all(0 < pss <= rss for pss, rss in zip(row["worker_pss_mb"], row["worker_rss_mb"], strict=True))
    traces = sorted(p.name for p in (out / "itt").glob("*.trace.json"))
    assert len(traces) == len(served) and json.loads((out / "itt" / traces[0]).read_text())["traceEvents"]
    peers = [r for r in document["rows"] if r["kind"] == "served_peer"]
    assert [(r["name"], r["precision"], r["payload"]) for r in peers] == [
        ("fastapi openvino int8 b1 c=2", "int8", "typical"),
        ("litserve openvino int8 b2 c=2", "int8", "typical"),
    ]
    for row in peers:
        assert row["complete"] > 0 and row["non_2xx"] == 0 and row["failed"] == 0
        assert row["cpu_ms_per_request"]["peer server"] > 0
        assert 0 < row["worker_pss_mb"][0] <= row["worker_rss_mb"][0]
    assert baseline["speedup_vs_baseline"] == 1.0
    assert optimized["runtime"] == "aoti" and set(optimized["allocator_loaded"]) == {"tcmalloc"}
    assert ipex["runtime"] == "ipex" and set(ipex["allocator_loaded"]) == {"tcmalloc"}
    assert baseline["placement"] == "none" and set(baseline["allocator_loaded"]) == {"default"}
    assert optimized["placement"] == "plan" and optimized["workers"] == len(optimized["cpu_affinity"])
    assert optimized["launcher_rss_mb"] == 0  # no launcher process stays behind a planned worker
    assert set(optimized["cpu_busy"]) == {str(c) for c in sorted(os.sched_getaffinity(0))}
    assert (int8["runtime"], int8["precision"]) == ("openvino", "int8") and int8["worker_load_s"] > 0
    assert int8["precompiled"] and optimized["precompiled"] and not baseline["precompiled"]
    # OpenVINO keeps glibc malloc whatever the preset asks for, and the workers show it.
    assert int8["allocator"] == "default" and set(int8["allocator_loaded"]) == {"default"}
    assert int8["cosine_mean"] >= 0.99  # from its in-process run, against float32 eager
    others = [(r["kind"], r["runtime"], r["precision"]) for r in document["rows"] if r["kind"] != "served"]
    assert ("peer", "openvino", "int8") in others and ("in_process", "openvino", "int8") in others
    assert len([o for o in others if o[0] == "in_process"]) == 4  # one per served row
    peer = next(r for r in document["rows"] if r["kind"] == "peer")
    assert peer["items_per_s"] > 0 and peer["cosine_mean"] >= 0.99
    report = (out / "report.md").read_text()
    assert "## minilm" in report and "## Targets" in report and "## CPU per request" in report
    assert "## Failed rows" in report and "| minilm | broken | ServerError: TorchServe exited" in report
    assert "minilm int8: best served row >= best in-process peer row" in report
    assert "minilm int8: best served row >= best served peer row" in report
    assert "## ITT ranges" in report and "ITT ranges cover every answered request" in report
    assert (out / "throughput.png").stat().st_size > 1000
    assert (out.parent / "latest").resolve() == out.resolve()
