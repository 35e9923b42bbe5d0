"""bench/metrics.py: TorchServe's Prometheus counters read between two scrapes."""

from __future__ import annotations

import pytest

from bench.metrics import parse_prometheus, server_latency, worker_load_seconds

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
