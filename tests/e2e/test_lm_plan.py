"""Your language model planned: the memory plan counts its KV cache per context and gives a
smaller one, shared by as many sequences, under a tight budget; `make tune MODELS=lm` measures numbers of sequences and
prompt lookup on real servers and writes the preset that serves the choice. Tiny random Qwen2 and
GPT-2 (tests/hf_models.py), made here under names of their own (tests/e2e/language_models.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import pytest

from kit.layout import PlanError
from kit.paths import CONFIG, ROOT
from kit.serve_config import PRESETS, ServeConfig
from kit.topology import read_topology
from tests.e2e.conftest import one_cpu, start_server
from tests.e2e.language_models import PROMPTS, Reference, generate, made_models
from tests.hf_models import gpt2_lm, qwen2_lm

pytestmark = pytest.mark.e2e

QWEN, GPT2 = "test-plan-qwen2-lm", "test-plan-gpt2-lm"
MAKERS = {QWEN: qwen2_lm, GPT2: gpt2_lm}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Their eager archives (the tests serve eager: ready in seconds)."""
    settings = {QWEN: {"prefill_chunk": 32, "batching": "continuous"}, GPT2: {"prefill_chunk": 0, "batching": "async"}}
    with made_models(tmp_path_factory.mktemp("lms"), MAKERS, settings, ("eager",)) as made:
        yield made


@pytest.fixture(scope="module")
def references(sources) -> dict[str, Reference]:
    return {name: Reference(path) for name, path in sources.items()}


def test_a_memory_budget_short_of_the_kv_caches_serves_smaller_ones_to_as_many_sequences(sources, references, tmp_path):
    """The plan counts a language model's KV cache per context (its archive's config.json and
    settings) in the footprint its last server recorded, and under a budget too small for a
    context a sequence gives its workers a KV cache of fewer contexts; the worker serves that
    cache to as many sequences at once, and answers as before."""
    config = ServeConfig.from_preset("optimized", variant="eager", models=list(MAKERS), cpus=one_cpu())
    topology = read_topology()
    if any(config.demand(m).footprint is None for m in MAKERS):
        start_server(tmp_path / "measure", config).stop()  # READY records the footprints
    most = {m: config.demand(m).sequences.most for m in MAKERS}

    def planned(budget: int):
        try:
            return dataclasses.replace(config, memory=str(budget)).layout(topology)
        except PlanError:
            return None

    # The largest budget, in steps of one context's cache, under which the first model loses one.
    per_context = config.demand(config.models[0]).sequences.per_sequence
    budget = planned(64 * 2**30).memory.total
    while (layout := planned(budget)) and layout.models[config.models[0]].kv_contexts == most[config.models[0]]:
        budget -= per_context
    assert layout is not None, "no budget serves a smaller KV cache without refusing"
    contexts = {m: layout.models[m].kv_contexts for m in MAKERS}
    assert contexts[config.models[0]] < most[config.models[0]] and layout.memory.total <= budget
    assert all(layout.models[m].sequences == most[m] for m in MAKERS)
    assert "contexts) ->" in layout.memory.note

    server = start_server(tmp_path / "tight", dataclasses.replace(config, memory=str(budget)))
    try:
        log = server.logs.model_log.read_text(errors="replace")
        for model in MAKERS:
            ready = f"{model} ready: backend=eager dtype=float32 sequences={most[model]} "
            assert re.search(rf"{ready}context=\d+ kv_cache={contexts[model]} contexts in float32 ", log), ready
        text, count = references[QWEN].prompt(PROMPTS[0])
        assert generate(server, QWEN, {"prompt": PROMPTS[0], "max_new_tokens": 24}).json()["text"] == text
    finally:
        server.stop()


def test_make_tune_measures_each_number_of_sequences_and_its_preset_serves_the_choice(sources, references, tmp_path):
    """`make tune MODELS=lm`'s command on real TorchServes: a server per candidate (eager here, to
    be quick; 4, 8 and 16 sequences at 16 streams), streamed and measured, each serving as many as
    asked however many its archive holds (8); the preset it writes serves the choice."""
    name = f"test-tune-lm-{os.getpid()}"
    command = [
        sys.executable,
        "-m",
        "bench",
        "--plan",
        "tune",
        "--models",
        QWEN,
        "--write-preset",
        name,
        "--streams",
        "16",
        "--lm-rounds",
        "1",
        "--lm-seconds",
        "2",
        "--lm-variants",
        "eager",
        "--out",
        str(tmp_path / "tune"),
    ]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        for sequences in (4, 8, 16):
            assert re.search(rf"\[tune\] eager x{sequences}: started in \d+ s, {sequences} sequences", done.stdout)
            worker = (tmp_path / "tune" / QWEN / f"eager-{sequences}-r0" / "model_log.log").read_text(errors="replace")
            assert f"{QWEN} ready: backend=eager dtype=float32 sequences={sequences} " in worker
            assert re.search(rf"\[tune\] eager x{sequences} sequences: [\d.]+ tokens/s, ITL p50", done.stdout)
        config = ServeConfig.from_preset(name)
        assert config.models == (QWEN,) and config.variant.name == "eager"
        chosen = config.model_sequences[QWEN]
        assert f"[tune] {QWEN}: eager x{chosen} sequences" in done.stdout
        # The winner again, without and with prompt lookup: served only where it paid, said either way.
        drafted = tmp_path / "tune" / QWEN / "lookup" / f"eager-{chosen}-lookup4-r0" / "model_log.log"
        assert " prompt_lookup=4 " in drafted.read_text(errors="replace")
        assert re.search(rf"\[tune\] eager x{chosen} sequences, prompt lookup 4: [\d.]+ tokens/s", done.stdout)
        served = config.model_settings.get(QWEN, {}).get("prompt_lookup", 0)
        assert ("prompt lookup served" if served else "prompt lookup not served") in done.stdout
        server = start_server(tmp_path / "tuned", dataclasses.replace(config, cpus=one_cpu()))
        try:
            log = server.logs.model_log.read_text(errors="replace")
            assert f"{QWEN} ready: backend=eager dtype=float32 sequences={chosen} " in log
            assert f" prompt_lookup={served} " in log
            text, _ = references[QWEN].prompt(PROMPTS[0])
            assert generate(server, QWEN, {"prompt": PROMPTS[0], "max_new_tokens": 24}).json()["text"] == text
        finally:
            server.stop()
    finally:
        for path in (PRESETS / f"{name}.yaml", CONFIG / f"{name}.properties"):
            path.unlink(missing_ok=True)
