"""handlers/generation/metrics.py: what a real engine records equals what its requests were told
(usage, finish reasons, prefix hits), its latencies are in the histograms, and the writer's file
is rewritten within a second of a change whether or not another request comes."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from handlers.generation.engine import Engine
from handlers.generation.metrics import BOUNDS_S, EngineMetrics, Gauges, Histogram, read_engine_files, writer
from handlers.generation.sequences import Finish, Generation, Usage
from tests.hf_models import qwen2_lm


class Told:
    def __init__(self):
        self.reason: Finish | None = None
        self.usage: Usage | None = None

    def text(self, delta: str, logprobs=()) -> None:
        pass

    def finish(self, reason: Finish, usage: Usage) -> None:
        self.reason, self.usage = reason, usage


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    directory = qwen2_lm(tmp_path_factory.mktemp("lm"))
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    return Engine(model, tokenizer.decode, set(), 2, 256, torch.float32, block_size=16)


def test_the_counts_are_what_the_requests_were_told(engine):
    engine.metrics = EngineMetrics()
    shared = tuple(range(5, 45))  # 40 tokens: two full blocks of 16 the second request finds
    asked = [
        (Generation(shared, 6), Told()),
        (Generation((*shared, 7, 8, 9), 4), Told()),
        (Generation((3, 4), 3), Told()),  # waits: two places
    ]
    for generation, told in asked[:1]:
        engine.submit(generation, told, key="first")
    while engine.busy:
        engine.step()
    for index, (generation, told) in enumerate(asked[1:]):
        engine.submit(generation, told, key=f"r{index}")
    while engine.busy:
        engine.step()
    metrics, usages = engine.metrics, [told.usage for _, told in asked]
    assert metrics.prompt_tokens == sum(u.prompt_tokens for u in usages) == 40 + 43 + 2
    assert metrics.generation_tokens == sum(u.completion_tokens for u in usages) == 6 + 4 + 3
    assert metrics.finished == {"length": 3}
    assert (metrics.prefix_queried_tokens, metrics.prefix_hit_tokens) == (40 + 43 + 2, 32)
    assert metrics.request.count == metrics.queue.count == metrics.first_token.count == 3
    assert metrics.inter_token.count == 13 - 3  # every token after a request's first
    assert metrics.first_token.total <= metrics.request.total
    assert engine.gauges() == Gauges(0, 0, 0.0)


def test_a_requests_choices_count_its_prompt_once(engine):
    engine.metrics = EngineMetrics()
    told = [Told(), Told()]
    engine.submit_all([(Generation((3, 4, 5), 2), t) for t in told], key="n2")
    while engine.busy:
        engine.step()
    assert engine.metrics.prompt_tokens == 3 and engine.metrics.generation_tokens == 4


def test_a_histogram_puts_a_time_in_the_first_bucket_that_holds_it():
    histogram = Histogram()
    for seconds in (0.0005, 0.0011, 0.5, 10_000.0):
        histogram.add(seconds)
    assert histogram.counts[0] == 1 and histogram.counts[1] == 1 and histogram.counts[-1] == 1
    assert histogram.count == 4 and histogram.quantile(0.5) == BOUNDS_S[1]


def test_the_file_is_rewritten_within_a_second_of_a_change_without_another_request(tmp_path):
    metrics, gauges = EngineMetrics(), Gauges(1, 2, 0.25)
    path = tmp_path / "lm-1.engine"
    rewriter = writer(path, "lm", metrics, lambda: gauges).start()
    try:
        metrics.ended("stop", 0.5, 10, 4)
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            read = list(read_engine_files(tmp_path))
            if read and read[0][2].metrics.generation_tokens == 4:
                break
            time.sleep(0.05)
        ((model, _, snapshot),) = read_engine_files(tmp_path)
        assert model == "lm" and snapshot.metrics.finished == {"stop": 1}
        assert snapshot.metrics.request.count == 1 and snapshot.gauges == gauges
    finally:
        rewriter.stop()
