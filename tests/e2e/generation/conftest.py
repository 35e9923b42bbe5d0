"""Your language model, served: `make model` from a causal LM directory the kit does not bundle, a
real TorchServe, answers token for token equal to transformers' greedy `generate`, streamed and
whole, many at once, through the kit's API, OpenAI's (with the official `openai` client) and gRPC.

Two families, tiny and random (tests/hf_models.py): Qwen2 (Llama-style: RoPE, grouped KV heads,
a ChatML chat template), served over TorchServe's continuousBatching, and GPT-2 (learned
positions, no chat template) over asyncCommunication, so every test runs on both protocols
(handlers/replies.py); a client that goes away is tested on continuousBatching, the protocol
that tells the worker. The reference text is transformers' tokens decoded as the kit streams text
(handlers/generation/stream.py, tested on its own against the tokenizer), so equal texts mean
equal tokens.

The package's modules share its models and its server of each variant (package-scoped fixtures,
one test process: tests/e2e/conftest.py's ModuleGroups); each server is checked, once its tests
are done, for a request that waited for the compiler. Reduced precisions are judged in
test_lm_precision.py, the memory plan and `make tune` in test_lm_plan.py: modules of their own,
so that the two test processes share the work (Makefile: test-e2e).
"""

from __future__ import annotations

import re

import pytest

from kit.serve_config import ServeConfig
from kit.server import Server
from tests.e2e.conftest import one_cpu, start_server
from tests.e2e.language_models import Reference, assert_archive_graphs, made_models
from tests.hf_models import gpt2_lm, qwen2_lm

QWEN, GPT2 = "test-yours-qwen2-lm", "test-yours-gpt2-lm"
MAKERS = {QWEN: qwen2_lm, GPT2: gpt2_lm}
VARIANTS = ("eager", "inductor", "openvino")
CHUNK = 32
LOOKUP = 4  # Qwen's prompt lookup: draft tokens a step
DRAFTED = {QWEN: {"prompt_lookup": LOOKUP}}  # served over its archive's settings (a preset's model_settings)


@pytest.fixture(scope="package")
def sources(tmp_path_factory):
    # Qwen's prompts are computed CHUNK tokens a step (chunked prefill; the longest prompt here in
    # 7 parts) while the other streams advance, over continuousBatching, and the servers below
    # draft its answers by prompt lookup (DRAFTED: every answer must still be transformers');
    # GPT-2's prompts whole (prefill_chunk 0), over asyncCommunication.
    settings = {
        QWEN: {"prefill_chunk": CHUNK, "batching": "continuous"},
        GPT2: {"prefill_chunk": 0, "batching": "async"},
    }
    with made_models(tmp_path_factory.mktemp("lms"), MAKERS, settings, VARIANTS) as made:
        yield made


@pytest.fixture(scope="package")
def references(sources) -> dict[str, Reference]:
    return {name: Reference(path) for name, path in sources.items()}


@pytest.fixture(scope="package", params=VARIANTS)
def server(request, sources, tmp_path_factory):
    config = ServeConfig.from_preset(
        "optimized", variant=request.param, models=list(MAKERS), cpus=one_cpu(), model_settings=DRAFTED
    )
    server = start_server(tmp_path_factory.mktemp(request.param), config)
    try:
        yield server
        assert_compiled_before_serving(server)  # after every test on it: an error at the last one's teardown
    finally:
        server.stop()


def assert_compiled_before_serving(server: Server) -> None:
    """Every shape the tests sent was compiled at warm-up; the READY lines say what was served."""
    log = server.logs.model_log.read_text(errors="replace")
    assert f"{QWEN} ready: backend={server.config.variant.name.split('-')[0]}" in log
    assert "recompiled while serving" not in log, "a request waited for the compiler"
    # The kit's engine drafts (the tests' prompts repeat themselves); OpenVINO's pipeline says it does not.
    lookup = 0 if server.config.variant.name == "openvino" else LOOKUP
    assert re.search(rf"{QWEN} ready: .* prompt_lookup={lookup} ", log), "the READY line does not say the lookup"
    assert re.search(rf"{GPT2} ready: .* prompt_lookup=0 ", log), "model_settings reached a model it does not name"
    if server.config.variant.name == "inductor":
        # Two graphs (a decode step; a prompt's part with decode rows): each more is compiled at
        # every start, a graph of a real-size model's some 40 s on 2 cores.
        for model in MAKERS:
            assert re.search(rf"{model} ready: .* graphs=2 ", log), f"{model} compiled other than 2 graphs"
            assert_archive_graphs(server, model, log)
