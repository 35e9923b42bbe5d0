"""kit/metrics_text.py: every worker's stage file and language-model engine file as Prometheus
text: cumulative buckets ending at the count, counters and gauges labelled by model and pid, a
family's HELP and TYPE once."""

from __future__ import annotations

import re

from handlers.generation.metrics import BOUNDS_S, EngineMetrics, Gauges, writer
from handlers.stages import Instant, Stage, StageClock
from kit.metrics_text import STAGE_BUCKETS, render

SAMPLE = re.compile(r'^(kit_[a-z0-9_]+)\{([a-z_]+="[^"]*"(?:,[a-z_]+="[^"]*")*)\} (\S+)$')


def write(directory, model: str, metrics: EngineMetrics, gauges: Gauges) -> None:
    writer(directory / f"{model}-1.engine", model, metrics, lambda: gauges).write()


def samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, line
        out[f"{match[1]}{{{match[2]}}}"] = float(match[3])
    return out


def test_a_workers_numbers_become_series_with_vllms_names(tmp_path):
    metrics = EngineMetrics()
    metrics.admitted(0.01, 40, 32)
    metrics.token(True, 0.2)
    for _ in range(3):
        metrics.token(False, 0.05)
    metrics.ended("stop", 0.4, 40, 4)
    metrics.drafted(4, 3)
    metrics.preempted()
    metrics.preempted()
    metrics.answered("ok")
    metrics.answered("overload")
    write(tmp_path, "lm", metrics, Gauges(2, 5, 0.125, 4096))
    text = render(tmp_path)
    values = samples(text)
    worker = 'model_name="lm",pid="'
    pid = next(k for k in values if k.startswith("kit_lm_prompt_tokens_total")).split('pid="')[1].split('"')[0]
    at = f'{worker}{pid}"'
    assert values[f"kit_lm_prompt_tokens_total{{{at}}}"] == 40
    assert values[f"kit_lm_generation_tokens_total{{{at}}}"] == 4
    assert values[f'kit_lm_request_success_total{{{at},finished_reason="stop"}}'] == 1
    assert values[f"kit_lm_prefix_cache_hits_total{{{at}}}"] == 32
    assert values[f"kit_lm_spec_decode_num_accepted_tokens_total{{{at}}}"] == 3
    assert values[f"kit_lm_num_preemptions_total{{{at}}}"] == 2
    assert values[f"kit_lm_num_requests_waiting{{{at}}}"] == 5
    # Requests by outcome: the classifiers' family, counted by the engine's file here.
    assert values[f'kit_requests_total{{{at},outcome="ok"}}'] == 1
    assert values[f'kit_requests_total{{{at},outcome="overload"}}'] == 1
    assert values[f"kit_lm_kv_cache_usage_perc{{{at}}}"] == 0.125
    assert values[f"kit_lm_prefix_store_bytes{{{at}}}"] == 4096
    assert values[f"kit_lm_inter_token_latency_seconds_count{{{at}}}"] == 3
    assert abs(values[f"kit_lm_inter_token_latency_seconds_sum{{{at}}}"] - 0.15) < 1e-9
    buckets = [v for k, v in values.items() if k.startswith(f"kit_lm_time_to_first_token_seconds_bucket{{{at}")]
    assert len(buckets) == len(BOUNDS_S) + 1 and buckets == sorted(buckets) and buckets[-1] == 1
    assert text.count("# TYPE kit_lm_time_to_first_token_seconds histogram") == 1
    assert text.count("# TYPE kit_requests_total counter") == 1


def test_two_workers_are_two_series_and_no_worker_renders_the_families_alone(tmp_path):
    assert "kit_lm_prompt_tokens_total{" not in render(tmp_path)
    write(tmp_path, "lm", EngineMetrics(), Gauges())
    write(tmp_path, "chat", EngineMetrics(), Gauges())
    models = {m for m in re.findall(r'model_name="([^"]+)"', render(tmp_path))}
    assert models == {"lm", "chat"}


def test_the_status_table_gives_a_line_per_worker_with_its_quantiles_and_gauges(tmp_path):
    from kit.metrics_text import engine_table

    assert engine_table(tmp_path) == []
    metrics = EngineMetrics()
    metrics.token(True, 0.25)
    metrics.token(False, 0.04)
    metrics.ended("stop", 0.3, 12, 2)
    write(tmp_path, "lm", metrics, Gauges(1, 3, 0.5))
    header, line = engine_table(tmp_path)
    assert header.split()[:5] == ["model", "pid", "requests", "prompt", "generated"]
    fields = line.split()
    assert fields[0] == "lm" and fields[2:5] == ["1", "12", "2"]
    ttft_p50 = int(fields[5].split("/")[0])
    assert 250 <= ttft_p50 < 250 * 1.25 + 1  # the bucket's upper bound, within 25 %
    assert fields[-3:] == ["1", "3", "50%"]


def test_a_workers_stages_and_outcomes_become_histograms_and_counters(tmp_path):
    clock = StageClock("bert", tmp_path)
    for seconds, requests in ((0.004, 2), (0.004, 1), (0.250, 4)):  # three calls, seven requests
        clock.record(Stage.MODEL, Instant(10.0, 1.0), Instant(10.0 + seconds, 1.0 + seconds / 2), requests)
    clock.answered("ok", 6)
    clock.answered("too_long")
    clock.writer.write()
    text = render(tmp_path)
    values = samples(text)
    at = f'model_name="bert",pid="{clock.pid}"'
    model = f'{at},stage="model"'
    assert values[f"kit_stage_seconds_count{{{model}}}"] == 3
    assert abs(values[f"kit_stage_seconds_sum{{{model}}}"] - 0.258) < 1e-9
    assert values[f"kit_stage_requests_total{{{model}}}"] == 7
    assert abs(values[f"kit_stage_cpu_seconds_total{{{model}}}"] - 0.129) < 1e-9
    buckets = {
        float(k.split('le="')[1].rstrip('"}')): v
        for k, v in values.items()
        if k.startswith(f"kit_stage_seconds_bucket{{{model}")
    }
    assert len(buckets) == len(STAGE_BUCKETS) + 1 and buckets[float("inf")] == 3
    assert list(buckets.values()) == sorted(buckets.values())
    # Each bound counts the calls at or under it: two of 4 ms, then the 250 ms one.
    assert {v for b, v in buckets.items() if 0.004 <= b < 0.25 * 0.6} == {2}
    assert all(v == 3 for b, v in buckets.items() if b >= 0.25)
    assert values[f'kit_requests_total{{{at},outcome="ok"}}'] == 6
    assert values[f'kit_requests_total{{{at},outcome="too_long"}}'] == 1
    assert text.count("# TYPE kit_stage_seconds histogram") == 1
    assert "kit_lm_" not in text.replace("# HELP kit_lm_", "").replace("# TYPE kit_lm_", "")  # no engine here
