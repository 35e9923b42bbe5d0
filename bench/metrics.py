"""TorchServe's own latency counters from the Prometheus metrics endpoint.

before = scrape(url); ...load...; after = scrape(url)
latency = server_latency(before, after, "resnet50")  # mean inference/queue ms per request
"""

from __future__ import annotations

import dataclasses
import re

import requests

# ts_inference_latency_microseconds{uuid="...",model_name="resnet50",model_version="default",} 1.2E7
SAMPLE = re.compile(r"^(?P<name>ts_\w+)\{(?P<labels>[^}]*)\}\s+(?P<value>[-+0-9.eE]+)$", re.MULTILINE)
# WorkerLoadTime{WorkerName="W-9000-resnet50_1.0",Level="Host",Hostname="vm",} 15691.0  (milliseconds)
WORKER_LOAD = re.compile(
    r'^WorkerLoadTime\{WorkerName="W-\d+-(?P<model>.+)_[^"_]+".*\}\s+(?P<ms>[-+0-9.eE]+)$', re.MULTILINE
)
LABEL = re.compile(r'(\w+)="([^"]*)"')

Samples = dict[tuple[str, str], float]  # (metric, model) -> value summed over label sets


def parse_prometheus(text: str) -> Samples:
    samples: Samples = {}
    for match in SAMPLE.finditer(text):
        model = dict(LABEL.findall(match["labels"])).get("model_name", "")
        key = (match["name"], model)
        samples[key] = samples.get(key, 0.0) + float(match["value"])
    return samples


def scrape_text(url: str, headers: dict[str, str] | None = None) -> str:
    response = requests.get(url, headers=headers or {}, timeout=10)
    response.raise_for_status()
    return response.text


def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    return parse_prometheus(scrape_text(url, headers))


def worker_load_seconds(text: str, model: str) -> float | None:
    """The slowest worker's spawn-to-READY time (TorchServe's WorkerLoadTime gauge), or None."""
    times = [float(m["ms"]) / 1000 for m in WORKER_LOAD.finditer(text) if m["model"] == model]
    return round(max(times), 1) if times else None


@dataclasses.dataclass(frozen=True)
class ServerLatency:
    inference_ms: float  # frontend time per request, received to answered (queue included)
    queue_ms: float  # time a request waited for a free worker


def requests_total(samples: Samples, model: str) -> int:
    """Requests the frontend has answered for `model` since it started."""
    return int(samples.get(("ts_inference_requests_total", model), 0.0))


def server_latency(before: Samples, after: Samples, model: str) -> ServerLatency | None:
    def delta(name: str) -> float:
        return after.get((name, model), 0.0) - before.get((name, model), 0.0)

    count = delta("ts_inference_requests_total")
    if count <= 0:
        return None
    return ServerLatency(
        inference_ms=delta("ts_inference_latency_microseconds") / count / 1000,
        queue_ms=delta("ts_queue_latency_microseconds") / count / 1000,
    )
