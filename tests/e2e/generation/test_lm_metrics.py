"""What the servers count, as the clients were told it: the router's /metrics within a second,
`make status`'s table, and a real Prometheus scraping them with the shipped rules and dashboard."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import requests

from kit.serve_config import ServeConfig
from kit.server import Server
from tests.e2e.conftest import one_cpu, start_server
from tests.e2e.generation.conftest import QWEN
from tests.e2e.language_models import PROMPTS
from tests.prometheus import Prometheus, dashboard_queries, finite, recorded_series, rules_file

pytestmark = pytest.mark.e2e


def scraped(server: Server, model: str) -> dict[str, float]:
    """The model's series on the router's /metrics, summed over its workers, by name and reason
    (a finish reason or an outcome)."""
    text = requests.get(server.api.openai_url("/metrics"), timeout=10).text
    values: dict[str, float] = {}
    for name, labels, value in re.findall(r"^(kit_\w+)\{([^}]*)\} (\S+)$", text, re.MULTILINE):
        if f'model_name="{model}"' in labels and 'le="' not in labels:
            reason = re.search(r'(?:finished_reason|outcome)="(\w+)"', labels)
            key = f"{name}:{reason[1]}" if reason else name
            values[key] = values.get(key, 0.0) + float(value)
    return values


def test_the_metrics_endpoint_counts_what_the_clients_were_told_within_a_second(server):
    """Six streamed completions: a scrape 1.5 s after the last answer (no request since) has moved
    each counter by what the answers' usage said, and the latency histograms by each token."""
    import openai
    from openai import OpenAI

    time.sleep(1.5)  # what the tests before it asked is in the file by now
    before = scraped(server, QWEN)
    client = OpenAI(base_url=server.api.openai_url("/v1"), api_key="unused")
    usages = []
    for index in range(6):
        chunks = client.completions.create(
            model=QWEN,
            prompt=f"{index}. {PROMPTS[index % len(PROMPTS)]}",
            max_tokens=5 + index,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages.append([chunk.usage for chunk in chunks if chunk.usage][0])
    with pytest.raises(openai.BadRequestError):  # refused, counted by its reason
        client.completions.create(model=QWEN, prompt="x", max_tokens=-1)
    time.sleep(1.5)
    after = scraped(server, QWEN)
    moved = {name: after[name] - before.get(name, 0.0) for name in after}
    assert moved["kit_lm_prompt_tokens_total"] == sum(u.prompt_tokens for u in usages)
    generated = sum(u.completion_tokens for u in usages)
    assert moved["kit_lm_generation_tokens_total"] == generated
    assert sum(v for k, v in moved.items() if k.startswith("kit_lm_request_success_total:")) == 6
    assert moved["kit_lm_time_to_first_token_seconds_count"] == 6
    assert moved["kit_lm_e2e_request_latency_seconds_count"] == 6
    assert moved["kit_lm_inter_token_latency_seconds_count"] == generated - 6
    assert after["kit_lm_num_requests_running"] == after["kit_lm_num_requests_waiting"] == 0
    assert moved["kit_requests_total:ok"] == 6 and moved["kit_requests_total:bad_input"] == 1
    # make status shows the same files: a line for the model's worker, its requests counted.
    (table,) = [lines for title, lines in server.numbers() if "language models" in title]
    (line,) = [line.split() for line in table[1:] if line.split()[0] == QWEN]
    assert int(line[2]) >= 6


def test_a_real_prometheus_scrapes_every_series_and_the_shipped_rules_and_dashboard_answer(server, tmp_path):
    """Issue 59: Debian's Prometheus scrapes the routers of a classifier server and of a language
    model server; after 20 good and 3 bad requests to bert and six streamed completions, its
    HTTP API answers the counts, deploy/k8s's rules pass promtool and record, and every query of
    deploy/grafana's dashboard returns a number. One backend: the series are the router's."""
    from openai import OpenAI

    if server.config.variant.name != "eager":
        pytest.skip("the series are the router's, the same for every backend: scraped once, on eager")
    rules = rules_file(tmp_path)
    checked = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Its own classifier server (eager: ready in seconds), not the optimized one other modules share.
    classifier = start_server(
        tmp_path / "classifier", ServeConfig.from_preset("optimized", variant="eager", models=["bert"], cpus=one_cpu())
    )
    routers = [s.api.openai_url("").removeprefix("http://") for s in (classifier, server)]
    try:
        with Prometheus.scraping(tmp_path, routers, rules) as prometheus:
            for index in range(20):
                answer = requests.post(
                    classifier.api.url("inference", "/predictions/bert"), data=f"text {index}".encode(), timeout=60
                )
                assert answer.status_code == 200, answer.text
            for body in (b"\xff\xfe not text", b"   ", b"\t"):
                answer = requests.post(classifier.api.url("inference", "/predictions/bert"), data=body, timeout=60)
                assert answer.status_code == 400, answer.text
            client = OpenAI(base_url=server.api.openai_url("/v1"), api_key="unused")
            generated = 0
            for index in range(6):
                chunks = client.completions.create(
                    model=QWEN,
                    prompt=PROMPTS[index % len(PROMPTS)],
                    max_tokens=6,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                generated += [chunk.usage for chunk in chunks if chunk.usage][0].completion_tokens
            time.sleep(3)  # the workers' files (within 1 s), then scrapes of 1 s
            assert set(prometheus.targets_up().values()) == {"up"}, prometheus.targets_up()
            # Counters grow from their start in each worker: the LM server's hold the tests before too.
            ok = prometheus.query('sum(kit_requests_total{model_name="bert",outcome="ok"})')
            refused = prometheus.query('sum(kit_requests_total{model_name="bert",outcome="bad_input"})')
            assert float(ok[0]["value"][1]) >= 20 and float(refused[0]["value"][1]) >= 3
            grew = prometheus.query(f'sum(increase(kit_lm_generation_tokens_total{{model_name="{QWEN}"}}[1m]))')
            assert finite(grew) and float(grew[0]["value"][1]) > 0
            answered = prometheus.query(f'sum(kit_lm_generation_tokens_total{{model_name="{QWEN}"}})')
            assert float(answered[0]["value"][1]) >= generated
            empty = {
                name: expr for name, expr in dashboard_queries().items() if not finite(prometheus.wait_for(expr, 10))
            }
            assert not empty, f"dashboard queries without a number: {empty}"
            unrecorded = [name for name in recorded_series() if not prometheus.wait_for(name, 10)]
            assert not unrecorded, unrecorded
    finally:
        classifier.stop()
