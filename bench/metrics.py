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
LABEL = re.compile(r'(\w+)="([^"]*)"')

Samples = dict[tuple[str, str], float]  # (metric, model) -> value summed over label sets


def parse_prometheus(text: str) -> Samples:
    samples: Samples = {}
    for match in SAMPLE.finditer(text):
        model = dict(LABEL.findall(match["labels"])).get("model_name", "")
        key = (match["name"], model)
        samples[key] = samples.get(key, 0.0) + float(match["value"])
    return samples


def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    response = requests.get(url, headers=headers or {}, timeout=10)
    response.raise_for_status()
    return parse_prometheus(response.text)


@dataclasses.dataclass(frozen=True)
class ServerLatency:
    inference_ms: float  # frontend time per request, received to answered (queue included)
    queue_ms: float  # time a request waited for a free worker


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
