"""Real HTTP against a real TorchServe running the optimized preset (Inductor, launcher, tcmalloc)."""

from __future__ import annotations

import re
import time

import psutil
import pytest
import requests
import torch

from bench.cpu_accounting import process_cpu_s
from bench.metrics import LABEL, parse_prometheus
from bench.payloads import photo_jpeg
from handlers.image import image_to_tensor
from handlers.loaders import load_model
from handlers.settings import Architecture, ImageSettings, TextSettings
from handlers.stages import FLUSH_S, Stage, merge, read_stage_files, summarize
from handlers.text import encode, load_tokenizer
from kit.pin_worker import KIT_WORKER_MODULE
from kit.server import Server
from kit.variant import Variant

pytestmark = pytest.mark.e2e

# Served = Inductor with freezing (BN folded, other kernels): probabilities agree to ~1e-5;
# 1e-4 leaves room for a different summation order without hiding a wrong model.
PROBABILITY_ATOL = 1e-4
EMBEDDING_ATOL = 1e-4


def post(server: Server, model: str, body: bytes, content_type: str) -> requests.Response:
    return requests.post(
        server.api.url("inference", f"/predictions/{model}"),
        data=body,
        headers={"Content-Type": content_type, **server.api.headers("inference")},
        timeout=60,
    )


def worker_pids(server: Server, model: str) -> set[int]:
    return {w.process.pid for w in server.api.workers() if w.model == model and w.process}


def assert_resnet50_matches_eager(server: Server) -> None:
    jpeg = photo_jpeg()
    response = post(server, "resnet50", jpeg, "image/jpeg")
    assert response.status_code == 200, response.text
    served = response.json()
    assert len(served) == 5

    model = load_model(ImageSettings(), Variant.load("eager").archive("resnet50"))
    with torch.inference_mode():
        probabilities = torch.softmax(model(image_to_tensor(jpeg)[None])[0], 0)
    top = torch.topk(probabilities, 5)
    assert list(served) == [str(int(i)) for i in top.indices]
    assert list(served.values()) == pytest.approx(top.values.tolist(), abs=PROBABILITY_ATOL)


def test_resnet50_matches_eager_reference(optimized_server):
    assert_resnet50_matches_eager(optimized_server)


def assert_bert_matches_eager(server: Server) -> None:
    text = "The film was a quiet, beautifully acted study of grief."
    response = post(server, "bert", text.encode(), "text/plain")
    assert response.status_code == 200, response.text
    served = response.json()

    model_dir = Variant.load("eager").archive("bert")
    model = load_model(TextSettings(), model_dir)
    inputs = tuple(t[None] for t in encode(load_tokenizer(model_dir), text, 128).inputs)
    with torch.inference_mode():
        probabilities = torch.softmax(model(*inputs)[0], 0)
    assert list(served) == ["LABEL_0", "LABEL_1"]
    assert list(served.values()) == pytest.approx(probabilities.tolist(), abs=PROBABILITY_ATOL)


def test_bert_matches_eager_reference(optimized_server):
    assert_bert_matches_eager(optimized_server)


def embed(server: Server, text: str) -> torch.Tensor:
    response = post(server, "minilm", f'{{"text": "{text}"}}'.encode(), "application/json")
    assert response.status_code == 200, response.text
    return torch.tensor(response.json())


def assert_minilm_matches_eager(server: Server) -> None:
    text = "A man is playing a guitar."
    served = embed(server, text)
    model_dir = Variant.load("eager").archive("minilm")
    model = load_model(TextSettings(architecture=Architecture.SENTENCE_EMBEDDER), model_dir)
    inputs = tuple(t[None] for t in encode(load_tokenizer(model_dir), text, 128).inputs)
    with torch.inference_mode():
        reference = model(*inputs)[0]
    assert served.shape == (384,)
    torch.testing.assert_close(served, reference, rtol=0, atol=EMBEDDING_ATOL)


def test_minilm_matches_eager_reference(optimized_server):
    assert_minilm_matches_eager(optimized_server)


def test_minilm_paraphrase_is_closer_than_unrelated(optimized_server):
    anchor = embed(optimized_server, "A man is playing a guitar.")
    paraphrase = embed(optimized_server, "Someone is strumming an acoustic guitar.")
    unrelated = embed(optimized_server, "The central bank raised interest rates again.")
    assert torch.linalg.norm(anchor).item() == pytest.approx(1.0, abs=1e-4)
    close, far = float(anchor @ paraphrase), float(anchor @ unrelated)
    assert close > far + 0.3, f"paraphrase cosine {close:.3f} vs unrelated {far:.3f}"


def assert_workers_run_where_the_plan_put_them(server: Server) -> None:
    layout = server.layout  # planned at start from this machine (kit/plan.py)
    workers = server.api.workers()
    for model, planned in layout.models.items():
        served = [w for w in workers if w.model == model]
        assert len(served) == len(planned.workers) and all(w.status == "READY" for w in served)
        # Read from /proc: the CPUs each worker may run on, its allocator, threads and NUMA policy.
        assert sorted(w.process.cpus for w in served) == sorted(tuple(sorted(p.cpus)) for p in planned.workers)
        for worker in served:
            slot = next(p for p in planned.workers if tuple(sorted(p.cpus)) == worker.process.cpus)
            assert worker.process.allocator == "tcmalloc", f"{model} maps {worker.process.allocator}"
            assert worker.process.omp_threads == str(slot.threads)
            assert worker.process.memory_policy == f"bind:{slot.numa_node}"


def test_workers_run_where_the_plan_put_them(optimized_server):
    # On one CPU here (tests/e2e/conftest.py); test_batching.py checks a plan over every CPU.
    assert_workers_run_where_the_plan_put_them(optimized_server)


def test_no_launcher_process_stays_behind_a_worker(optimized_server):
    # TorchServe's launcher (torch.backends.xeon.run_cpu) stays as every worker's parent, ~225 MB
    # each; kit/pin_worker.py execs into the worker instead.
    tree = optimized_server.process_tree()
    assert not [p.pid for p in tree if "run_cpu" in " ".join(p.cmdline())]
    frontend = next(p for p in tree if p.name() == "java")
    for worker in optimized_server.api.workers():
        assert psutil.Process(worker.process.pid).ppid() == frontend.pid


def test_metrics_endpoint_counts_each_request(optimized_server):
    def scrape() -> dict:
        response = requests.get(optimized_server.api.url("metrics", "/metrics"), timeout=10)
        assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/plain")
        return parse_prometheus(response.text)

    post(optimized_server, "bert", b"warm the counters", "text/plain")  # the series exist from here on
    before = scrape()
    assert post(optimized_server, "bert", b"one more request", "text/plain").status_code == 200
    after = scrape()
    key = ("ts_inference_requests_total", "bert")
    assert after[key] - before[key] == 1
    latency = ("ts_inference_latency_microseconds", "bert")
    assert after[latency] > before[latency]


def test_the_kits_metrics_count_every_request_by_stage_and_outcome_beside_torchserves(optimized_server):
    """Issue 59: 20 good and 3 bad requests to bert, then a scrape of the router's /metrics 3 s
    after the last answer, with no request since: every request counted in every stage and by
    its outcome, TorchServe's own series in the same answer."""
    sample = re.compile(r"^(?P<name>\w+)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$", re.MULTILINE)

    def scrape() -> dict[tuple[str, str, str], float]:
        response = requests.get(optimized_server.api.openai_url("/metrics"), timeout=10)
        assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/plain")
        out: dict[tuple[str, str, str], float] = {}
        for match in sample.finditer(response.text):
            labels = dict(LABEL.findall(match["labels"]))
            if labels.get("model_name") == "bert":
                key = (match["name"], labels.get("stage", ""), labels.get("outcome", ""))
                out[key] = out.get(key, 0.0) + float(match["value"])
        return out

    time.sleep(FLUSH_S + 0.5)  # what the tests before asked is in the workers' files by now
    before = scrape()
    for index in range(20):
        assert post(optimized_server, "bert", f"a good text {index}".encode(), "text/plain").status_code == 200
    for body in (b"\xff\xfe not text", b"   ", b'{"words": "no text field"}'):
        assert post(optimized_server, "bert", body, "application/octet-stream").status_code == 400
    time.sleep(3)
    after = scrape()

    def grown(name: str, stage: str = "", outcome: str = "") -> float:
        return after.get((name, stage, outcome), 0.0) - before.get((name, stage, outcome), 0.0)

    assert grown("kit_requests_total", outcome="ok") == 20
    assert grown("kit_requests_total", outcome="bad_input") == 3
    for stage in (Stage.READ, Stage.DECODE, Stage.MODEL, Stage.FORMAT, Stage.WRITE):
        assert grown("kit_stage_requests_total", stage.value) == 23, stage
        calls = grown("kit_stage_seconds_count", stage.value)
        assert 1 <= calls <= 23 and grown("kit_stage_seconds_sum", stage.value) > 0, stage
    assert ("ts_inference_requests_total", "", "") in after  # TorchServe's, in the same scrape


def test_the_frontend_jvm_runs_the_presets_collector(optimized_server):
    java = [p for p in optimized_server.process_tree() if p.name() == "java"]
    assert len(java) == 1, [p.name() for p in optimized_server.process_tree()]
    options = optimized_server.config.frontend_jvm_args.split()
    assert {"-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xmn24m", "-Dio.netty.allocator.maxOrder=9"} <= set(options)
    assert set(options) <= set(java[0].cmdline())  # TorchServe passed them on


def test_workers_are_the_kits_and_time_every_stage(optimized_server):
    """kit/pin_worker.py runs handlers/worker.py: no per-request log or metric lines, and each worker's
    stage histograms on disk (what `make status` and the bench read), every stage once per call."""
    model = "bert"
    workers = [w for w in optimized_server.api.workers() if w.model == model]
    assert all(KIT_WORKER_MODULE in psutil.Process(w.process.pid).cmdline() for w in workers)
    log_start = optimized_server.logs.model_log.stat().st_size
    for round_ in range(2):  # a worker writes at most once a second, on a call: a second round flushes the first
        for index in range(4 * len(workers)):
            assert post(optimized_server, model, f"text {round_} {index}".encode(), "text/plain").status_code == 200
        time.sleep(FLUSH_S + 0.1)
    files = list(read_stage_files(optimized_server.stages_dir))
    with_files = {int(path.stem.rpartition("-")[2]) for path in optimized_server.stages_dir.glob("*.json")}
    assert worker_pids(optimized_server, model) <= with_files
    for name, histograms in files:
        calls = {stage: histograms[stage].calls for stage in Stage}
        if not any(calls.values()):
            continue  # a worker that has served nothing yet (another model's, run alone)
        # The frame stages time every call, the handler's every call it answered (a batch-level
        # gRPC error raises before they are recorded).
        assert calls[Stage.READ] == calls[Stage.WRITE] >= calls[Stage.MODEL] > 0, (name, calls)
        assert calls[Stage.DECODE] == calls[Stage.MODEL] == calls[Stage.FORMAT], (name, calls)
        assert calls[Stage.WAIT] == calls[Stage.READ] - 1  # none before a worker's first call
    served = summarize(merge(files)[model])
    assert served[Stage.MODEL].requests >= 4 * len(workers)
    assert 0 < served[Stage.MODEL].p50_ms < 60_000
    # The process's CPU in a stage: some; more than its wall time only with the backend's threads.
    threads = max(w.threads for w in optimized_server.layout.models[model].workers)
    for stage in (Stage.DECODE, Stage.MODEL):
        assert 0 < served[stage].cpu_ms_per_request <= threads * served[stage].ms_per_request + 0.1, served[stage]
    written = optimized_server.logs.model_log.read_text(errors="replace")[log_start:]
    assert "Backend received inference" not in written and "PredictionTime" not in written


def test_the_frontend_jit_is_accounted_apart(optimized_server):
    frontend = next(p for p in optimized_server.process_tree() if p.name() == "java")
    cpu = process_cpu_s([frontend], lambda process: "frontend")
    assert cpu[(frontend.pid, "jit")][0] == "frontend JIT" and cpu[(frontend.pid, "jit")][1] > 0
    total = frontend.cpu_times().user + frontend.cpu_times().system
    assert 0 < cpu[(frontend.pid, "")][1] < total
