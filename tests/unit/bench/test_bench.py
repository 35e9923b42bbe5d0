"""The bench's pure parts: ab output parsing, plan validation and expansion, report rendering."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import yaml

from bench import runner
from bench.ab import AbParseError, ab_command, parse_ab
from bench.cpu_accounting import per_request_ms
from bench.metrics import parse_prometheus, server_latency, worker_load_seconds
from bench.payloads import DEFAULT_PAYLOAD
from bench.plan import PLANS, Peer, PlanError, Runtime, load_plan, parse_plan
from bench.report import write_report
from bench.results import BenchRun, InProcessResult, RowResult, RunEnvironment, add_derived
from bench.targets import check_targets
from handlers.backends import DType
from kit.models import Model
from kit.topology import parse_topology
from kit.variant import Variant
from tests.machines import FIXTURES

ENVIRONMENT = RunEnvironment("cpu", 2, "2.13.0", "0.12.0", "3.11", "abc", "d")

AB_OUTPUT = """\
Server Software:
Server Hostname:        127.0.0.1
Server Port:            8080

Document Path:          /predictions/resnet50
Document Length:        151 bytes

Concurrency Level:      4
Time taken for tests:   20.004 seconds
Complete requests:      482
Failed requests:        37
   (Connect: 0, Receive: 0, Length: 37, Exceptions: 0)
Non-2xx responses:      3
Keep-Alive requests:    482
Total transferred:      139021 bytes
Total body sent:        47127284
HTML transferred:       72589 bytes
Requests per second:    24.10 [#/sec] (mean)
Time per request:       166.009 [ms] (mean)
Time per request:       41.502 [ms] (mean, across all concurrent requests)
Transfer rate:          6.79 [Kbytes/sec] received

Percentage of the requests served within a certain time (ms)
  50%    162
  66%    170
  75%    176
  80%    181
  90%    196
  95%    209
  98%    221
  99%    228
 100%    265 (longest request)
"""


def test_parse_ab_reads_every_field():
    result = parse_ab(AB_OUTPUT)
    assert result.complete == 482
    assert result.failed == 0  # 37 "Length" failures are varying JSON sizes, not errors
    assert result.non_2xx == 3
    assert result.requests_per_s == 24.10
    assert result.mean_ms == 166.009
    assert (result.p50_ms, result.p90_ms, result.p99_ms, result.max_ms) == (162, 196, 228, 265)
    assert result.duration_s == 20.004


def test_parse_ab_counts_real_failures_and_missing_non2xx():
    text = AB_OUTPUT.replace(
        "(Connect: 0, Receive: 0, Length: 37, Exceptions: 0)", "(Connect: 2, Receive: 1, Length: 5, Exceptions: 4)"
    )
    text = text.replace("Non-2xx responses:      3\n", "")
    result = parse_ab(text)
    assert result.failed == 7
    assert result.non_2xx == 0


def test_parse_ab_names_a_missing_field():
    with pytest.raises(AbParseError, match="'Requests per second'"):
        parse_ab(AB_OUTPUT.replace("Requests per second", "Requests/s"))


def test_ab_command_is_an_argv_with_keepalive(tmp_path):
    argv = ab_command(
        "http://127.0.0.1:1/predictions/bert",
        tmp_path / "s.txt",
        "text/plain",
        seconds=20,
        concurrency=4,
        headers={"Authorization": "Bearer k"},
    )
    assert argv[:2] == ["ab", "-k"]
    assert argv[argv.index("-t") + 1] == "20" and argv[argv.index("-c") + 1] == "4"
    assert argv.index("-n") > argv.index("-t")  # -t would otherwise cap -n at 50000
    assert argv[argv.index("-H") : argv.index("-H") + 2] == ["-H", "Authorization: Bearer k"]
    assert argv[-1] == "http://127.0.0.1:1/predictions/bert"


PROMETHEUS = """\
# HELP ts_inference_latency_microseconds Cumulative inference duration in microseconds
# TYPE ts_inference_latency_microseconds counter
ts_inference_latency_microseconds{uuid="u",model_name="bert",model_version="default",} 2000000.0
ts_queue_latency_microseconds{uuid="u",model_name="bert",model_version="default",} 500000.0
ts_inference_requests_total{uuid="u",model_name="bert",model_version="default",} 20.0
ts_inference_requests_total{uuid="u",model_name="resnet50",model_version="default",} 7.0
WorkerLoadTime{WorkerName="W-9000-resnet50_1.0",Level="Host",Hostname="vm",} 2500.0
WorkerLoadTime{WorkerName="W-9001-resnet50_1.0",Level="Host",Hostname="vm",} 4100.0
WorkerLoadTime{WorkerName="W-9002-bert_1.0",Level="Host",Hostname="vm",} 9000.0
"""


def test_worker_load_is_the_slowest_worker_of_the_model():
    assert worker_load_seconds(PROMETHEUS, "resnet50") == 4.1
    assert worker_load_seconds(PROMETHEUS, "bert") == 9.0
    assert worker_load_seconds(PROMETHEUS, "minilm") is None


def test_server_latency_from_counter_deltas():
    after = parse_prometheus(PROMETHEUS)
    before = {key: value / 2 for key, value in after.items()}
    latency = server_latency(before, after, "bert")
    assert latency.inference_ms == pytest.approx(100.0)  # 1e6 us over 10 requests
    assert latency.queue_ms == pytest.approx(25.0)
    assert server_latency(after, after, "bert") is None


def test_bundled_plans_are_valid():
    # Every plan loads; those comparing against TorchServe out of the box have one baseline per model.
    from bench.plan import GENERATE, PLANS, read_plan

    with_baseline = {"quick", "default", "full", "tune", "placement", "backends"}
    names = {p.stem for p in PLANS.glob("*.yaml")}
    assert with_baseline | {"frontend", "phone"} <= names
    serving = {name for name in names if read_plan(name)[1].get("kind") != GENERATE}
    assert names - serving == {"generate", "generate-lookup", "generate-structured"}
    for name in serving:
        plan = load_plan(name)
        assert plan.rows, name
        if name in with_baseline:
            for model in {r.model for r in plan.rows}:
                assert sum(r.baseline for r in plan.rows if r.model == model) == 1, f"{name}: one baseline per model"


def test_a_plan_names_the_archives_it_needs():
    plan = load_plan("default")
    # Row variants for the models that run them; eager for the peers' weights and the baseline.
    assert plan.archives["aoti-int8"] == ["resnet50", "bert"]
    assert plan.archives["eager"] == ["resnet50", "bert"]
    assert set(plan.archives) == {
        "eager",
        "inductor",
        "inductor-mkl",
        "inductor-bf16",
        "openvino",
        "openvino-bf16",
        "aoti-int8",
        "openvino-int8",
        "ipex",
        "ipex-bf16",
    }
    assert plan.archives["inductor-mkl"] == ["bert"]
    tiny = parse_plan("t", {"models": ["minilm"], "rows": [{"name": "x", "preset": "optimized", "variant": "aoti"}]})
    assert tiny.archives == {"aoti": ["minilm"]}  # no peers: no eager archive needed


def test_matrix_expands_with_named_rows():
    plan = parse_plan(
        "t",
        {
            "models": ["resnet50"],
            "rows": [
                {
                    "name": "layout",
                    "preset": "fixed-2x1",
                    "allocator": ["jemalloc", "tcmalloc"],
                    "workers": [1, 2],
                    "threads": 1,
                },
            ],
        },
    )
    assert [r.name for r in plan.rows] == [
        "layout allocator=jemalloc workers=1",
        "layout allocator=jemalloc workers=2",
        "layout allocator=tcmalloc workers=1",
        "layout allocator=tcmalloc workers=2",
    ]
    assert plan.rows[3].serve.allocator.value == "tcmalloc" and plan.rows[3].serve.workers == 2


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"rows": [{"name": "x", "alocator": "tcmalloc"}]}, r"row 1 \('x'\): unknown key\(s\) \['alocator'\]"),
        ({"rows": [{"preset": "optimized"}]}, "every row needs a name"),
        ({"rows": [{"name": "x", "allocator": "mimalloc"}]}, "allocator 'mimalloc' is unknown"),
        ({"rows": [{"name": "x", "inference_port": 80}]}, "chosen by the bench"),
        ({"secs": 5, "rows": [{"name": "x"}]}, r"unknown setting\(s\) \['secs'\]"),
        ({"rows": []}, "has no rows"),
        ({"rows": [{"name": "a", "baseline": True}, {"name": "b", "baseline": True}]}, "several baseline rows"),
        (
            {"models": ["bert"], "rows": [{"name": "a"}, {"name": "a", "payload": "short"}]},
            r"several rows are labelled \['bert / a'\]; give each its own name",
        ),
    ],
)
def test_plan_errors_name_the_problem(raw, message):
    with pytest.raises(PlanError, match=message):
        parse_plan("t", raw)


def test_unknown_plan_lists_choices():
    with pytest.raises(
        PlanError,
        match="plan 'fast' not found; choose one of: backends, batching, default, frontend, full, generate, generate-lookup, generate-structured, lengths, metrics, phone, placement, quick, served, tune",
    ):
        load_plan("fast")


def row_result(**overrides) -> RowResult:
    values = dict(
        model="resnet50",
        name="row",
        kind="served",
        variant="inductor",
        runtime="inductor",
        precompiled=False,
        precision="float32",
        placement="plan",
        objective="throughput",
        cpus="",
        allocator="tcmalloc",
        omp_wait_policy="passive",
        workers=2,
        threads=1,
        batch_size=1,
        max_batch_delay_ms=5,
        concurrency=4,
        baseline=False,
        requests_per_s=20.0,
        items_per_s=20.0,
        mean_ms=200.0,
        p50_ms=190.0,
        p90_ms=220.0,
        p99_ms=250.0,
        max_ms=260.0,
        duration_s=20.0,
        failed=0,
        non_2xx=0,
        complete=400,
        start_to_ready_s=30.0,
        ts_inference_ms=80.0,
        ts_queue_ms=90.0,
        allocator_loaded=["tcmalloc", "tcmalloc"],
        cpu_affinity=[[0], [1]],
        worker_rss_mb=[600.0, 600.0],
        launcher_rss_mb=0.0,
        worker_count=2,
        ab_command="ab -k ...",
    )
    values.update(overrides)
    values.setdefault("payload", DEFAULT_PAYLOAD[Model.load(values["model"]).task.medium])
    return RowResult(**values)


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


def reference(**overrides) -> InProcessResult:
    values = dict(
        model="resnet50",
        name="openvino int8 b1",
        kind="peer",
        runtime="openvino",
        precision="int8",
        batch_size=1,
        workers=1,
        threads=2,
        items_per_s=100.0,
        cosine_mean=0.9995,
        cosine_min=0.999,
        top1_agreement=1.0,
    )
    values.update(overrides)
    return InProcessResult(**values)


def test_served_rows_are_compared_with_peers_per_precision(tmp_path):
    results = [
        row_result(
            name="aoti int8", runtime="aoti", precompiled=True, precision="int8", items_per_s=90.0, worker_load_s=3.2
        ),
        row_result(name="inductor", items_per_s=30.0, worker_load_s=40.0),
    ]
    references = [
        reference(),  # int8 peer at 100/s: the int8 row is short by 10 %
        reference(name="onnxruntime float32 b1", runtime="onnxruntime", precision="float32", items_per_s=27.0),
        reference(name="aoti-int8 2x1 b1", kind="in_process", runtime="aoti", top1_agreement=0.9),
    ]
    checks = {c.target: c for c in check_targets(results, references)}
    int8 = checks["resnet50 int8: best served row >= best in-process peer row"]
    assert not int8.met and "90%, short by 10%" in int8.measured
    assert checks["resnet50 float32: best served row >= best in-process peer row"].met
    # Overall: the best served row (int8, 90/s) against the best peer (int8, 100/s).
    assert not checks["resnet50 any precision: best served row >= best in-process peer row"].met
    accuracy = {k: c for k, c in checks.items() if "top1_agreement" in k}
    assert [c.met for c in accuracy.values()] == [True, False]  # the peer at 100 %, in-process at 90 %
    cold = [c for k, c in checks.items() if "spawn-to-READY" in k]
    assert [c.met for c in cold] == [True]  # only the precompiled (aoti) row is held to 5 s

    out = tmp_path / "run"
    write_report(out, BenchRun(load_plan("quick"), "python -m bench", ENVIRONMENT, results, references))
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["kind"], r["runtime"], r["precision"]) for r in rows] == [
        ("served", "aoti", "int8"),
        ("served", "inductor", "float32"),
        ("peer", "openvino", "int8"),
        ("peer", "onnxruntime", "float32"),
        ("in_process", "aoti", "int8"),
    ]
    assert (
        "| openvino int8 b1 | peer | openvino | int8 | 1×2 | 1 | 100.0 | 0.9995/0.9990 | 100% |"
        in (out / "report.md").read_text()
    )


def test_plan_peers_are_parsed_and_checked():
    plan = parse_plan("t", {"rows": [{"name": "x"}], "peers": [{"runtime": "openvino", "precision": "int8"}]})
    assert plan.peers == (Peer(Runtime.OPENVINO, DType.INT8),)
    with pytest.raises(PlanError, match="runtime 'tensorrt' is unknown; choose one of: onnxruntime, openvino"):
        parse_plan("t", {"rows": [{"name": "x"}], "peers": [{"runtime": "tensorrt"}]})


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


def test_cpu_per_request_counts_processes_alive_at_both_ends():
    before = {
        (10, ""): ("frontend", 1.0),
        (10, "jit"): ("frontend JIT", 0.5),
        (11, ""): ("workers", 2.0),
        (12, ""): ("workers", 5.0),
    }
    after = {
        (10, ""): ("frontend", 1.5),
        (10, "jit"): ("frontend JIT", 0.6),
        (11, ""): ("workers", 3.0),
        (13, ""): ("workers", 9.0),
    }  # 12 died, 13 replaced it
    assert per_request_ms(before, after, ab_cpu_s=0.1, requests=100) == {
        "ab": 1.0,
        "frontend": 5.0,
        "frontend JIT": 1.0,
        "workers": 10.0,
    }


def test_report_breaks_down_cpu_per_request(tmp_path):
    results = [row_result(cpu_ms_per_request={"frontend": 4.9, "workers": 11.2, "ab": 0.6})]
    out = tmp_path / "results" / "run"
    write_report(out, BenchRun(load_plan("quick"), "python -m bench --plan quick", ENVIRONMENT, results))
    report = (out / "report.md").read_text()
    assert "## CPU per request" in report
    assert "| resnet50 | row | 0.6 | 4.9 | 11.2 | 16.7 |" in report
    assert (out / "cpu_per_request.png").read_bytes()[:4] == b"\x89PNG"


def test_rows_name_their_payload_and_it_fits_the_model():
    plan = parse_plan("p", {"models": ["resnet50", "bert"], "rows": [{"name": "opt"}]})
    assert {(r.model, r.payload) for r in plan.rows} == {("resnet50", "vga"), ("bert", "typical")}
    plan = parse_plan("p", {"rows": [{"name": "photos", "models": ["resnet50"], "payload": ["thumbnail", "phone"]}]})
    assert [(r.name, r.payload) for r in plan.rows] == [
        ("photos payload=thumbnail", "thumbnail"),
        ("photos payload=phone", "phone"),
    ]
    with pytest.raises(
        PlanError, match=r"payload 'phone' does not fit bert \(text\); use one of \['long', 'short', 'typical'\]"
    ):
        parse_plan("p", {"rows": [{"name": "x", "models": ["bert"], "payload": "phone"}]})
    with pytest.raises(PlanError, match="unknown payload 'huge'; choose one of"):
        parse_plan("p", {"rows": [{"name": "x", "models": ["resnet50"], "payload": "huge"}]})


def test_served_peers_are_compared_on_the_same_payload_only():
    results = [
        row_result(name="baseline", baseline=True, items_per_s=10.0, requests_per_s=10.0),
        row_result(name="aoti int8", precision="int8", items_per_s=90.0, requests_per_s=90.0),
        # Thumbnails are cheaper: not comparable with rows on the default payload.
        row_result(
            name="aoti int8 thumbs", precision="int8", payload="thumbnail", items_per_s=300.0, requests_per_s=300.0
        ),
        row_result(
            name="litserve b4 c=8", kind="served_peer", precision="int8", items_per_s=120.0, requests_per_s=120.0
        ),
        row_result(
            name="fastapi b1 c=8", kind="served_peer", precision="float32", items_per_s=40.0, requests_per_s=40.0
        ),
    ]
    add_derived(results)
    checks = {c.target: c for c in check_targets(results)}
    int8 = checks["resnet50 int8: best served row >= best served peer row"]
    assert not int8.met and int8.measured == "90.0 (aoti int8) vs 120.0 (litserve b4 c=8): 75%, short by 25%"
    assert not checks["resnet50 float32: best served row >= best served peer row"].met  # the baseline's 10 vs 40
    # The speed-up target looks at the kit's rows on the default payload: not the peer, not thumbnails.
    assert checks["resnet50: best row >= 3.0x baseline req/s"].measured == "9.00x (aoti int8)"


def test_short_text_is_checked_against_typical_on_the_same_configuration():
    results = [
        row_result(model="bert", name="aoti typical", variant="aoti-int8", requests_per_s=10.0),
        row_result(model="bert", name="aoti short", variant="aoti-int8", payload="short", requests_per_s=35.0),
        row_result(model="bert", name="ov short", variant="openvino", payload="short", requests_per_s=20.0),
        row_result(model="bert", name="ov typical", variant="openvino", requests_per_s=8.0),
        # Another layout: compared with nothing.
        row_result(model="bert", name="ov short b4", variant="openvino", payload="short", batch_size=4),
    ]
    checks = {c.target: c for c in check_targets(results)}
    aoti = checks["bert aoti-int8: short payload >= 3.0x typical req/s"]
    assert aoti.met and aoti.measured == "3.50x (35.0 vs 10.0)"
    assert not checks["bert openvino: short payload >= 3.0x typical req/s"].met  # 2.5x
    assert len([t for t in checks if "short payload" in t]) == 2


def test_tune_searches_cores_per_worker_up_to_the_machines_l3_domain():
    epyc = parse_topology((FIXTURES / "epyc-96c-12ccd-smt.txt").read_text())
    plan = parse_plan("tune", yaml.safe_load((PLANS / "tune.yaml").read_text()), epyc)
    names = sorted({row.name for row in plan.rows if row.name.startswith("plan cores per worker")})
    assert names == [f"plan cores per worker threads={n}" for n in (2, 4, 8)]
    assert {row.serve.threads for row in plan.rows if row.name in names} == {2, 4, 8}


def quick_plan_without_references():
    plan = load_plan("quick")  # baseline, optimized, fixed 2x1 for resnet50 and bert
    return dataclasses.replace(plan, run=dataclasses.replace(plan.run, in_process=False), peers=(), served_peers=())


def fake_rows(monkeypatch, failing: set[tuple[str, str]]):
    """run_row without a server: a result for each row, ServerError for the (model, name) in `failing`."""
    from kit.server import ServerError

    def run_row(row, plan, out_dir, payload):
        if (row.model, row.name) in failing:
            raise ServerError(
                "TorchServe exited during start-up: Unrecognized VM option 'X'; see torchserve.out\n"
                "Error: Could not create the Java Virtual Machine."
            )
        return row_result(model=row.model, name=row.name, baseline=row.baseline)

    monkeypatch.setattr("bench.runner.run_row", run_row)


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
