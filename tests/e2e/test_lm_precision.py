"""Your language model in reduced precision: bf16, int8 weights and an int8 KV cache judged
against float32 before they serve (eager and Inductor) and refused by name when too far; OpenVINO's IRs judged when
built and not installed when too far. A tiny random Qwen2 (tests/hf_models.py), made here under a
name of its own (tests/e2e/language_models.py).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import threading

import pytest
import requests
import torch
import yaml

from handlers.backends import DType, cpu_refusal
from kit.models import model_file
from kit.paths import ROOT
from kit.serve_config import ServeConfig
from kit.server import ServerError, start_ready
from kit.variant import Variant
from tests.e2e.conftest import one_cpu, start_server
from tests.e2e.language_models import CHAT, PROMPTS, assert_archive_graphs, generate, made_models
from tests.e2e.test_your_model import remove_model
from tests.hf_models import qwen2_lm

pytestmark = pytest.mark.e2e

QWEN = "test-precision-qwen2-lm"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Its eager archive only: each test derives model files of its own from QWEN's."""
    settings = {QWEN: {"prefill_chunk": 32, "batching": "continuous"}}
    with made_models(tmp_path_factory.mktemp("lms"), {QWEN: qwen2_lm}, settings, ("eager",)) as made:
        yield made


# A reduced precision per case: its handler settings, how it is named, its variant's CPU refusal.
REDUCED = {
    "bf16": ({"dtype": "bfloat16"}, "bfloat16", cpu_refusal(DType.BFLOAT16)),
    "int8-weights": ({"weights": "int8"}, "float32 on int8 weights", ""),
    "int8-kv": ({"kv_cache": "int8"}, "float32 with an int8 KV cache", ""),
}


@pytest.mark.parametrize("reduced", sorted(REDUCED))
def test_a_reduced_precision_is_judged_against_float32_and_refused_by_name_when_too_far(sources, tmp_path, reduced):
    """A worker serving bf16 or int8 weights first measures its greedy tokens and next-token
    distributions against the float model on held-out prompts (handlers/generation/agreement.py):
    within the limits it serves and logs the agreement; with a model file's stricter limit it does
    not start, and the reason the user sees names what failed. Eager: the guard judges the model
    before any compiler. The first is judged on the user's prompts (its SAMPLES: 5), the second on
    4 of the kit's."""
    settings, precision, refusal = REDUCED[reduced]
    if refusal:
        pytest.skip(refusal)
    document = yaml.safe_load(model_file(QWEN).read_text())
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"{PROMPTS[i % 2]}, part {i}\n" for i in range(5)))
    made = {
        f"test-yours-lm-{reduced}": {"handler": {}, "samples": str(prompts)},
        f"test-yours-lm-{reduced}-strict": {"handler": {"accuracy_tolerance": 1e-4, "accuracy_prompts": 4}},
    }
    for name, extra in made.items():
        handler = {**document.get("handler", {}), **settings, **extra.pop("handler")}
        model_file(name).write_text(yaml.safe_dump({**document, **extra, "handler": handler}))
    try:
        build = [sys.executable, "-m", "model_store.build", "--models", ",".join(made), "--variants", "eager"]
        done = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        good, strict = made
        # The float model answers the held-out prompts once, in the build; the workers read its answers.
        shipped = rf"eager/{good}: the float model's answers on 5 held-out prompts shipped \([\d.]+ MB, in \d+s\)"
        assert re.search(shipped, done.stdout), done.stdout[-3000:]
        config = ServeConfig.from_preset("optimized", variant="eager", models=[good], cpus=one_cpu())
        server = start_server(tmp_path / "good", config)
        try:
            log = server.logs.model_log.read_text(errors="replace")
            assert re.search(
                rf"{good}: the float model's answers on 5 held-out prompts \(\d+ tokens each\) read from the archive",
                log,
            )
            assert re.search(
                rf"{good} accuracy against float32: greedy tokens [\d.]+% equal \(\d+ of \d+ positions, 5 prompts\)"
                rf".* \(served in {precision}\)",
                log,
            )
            dtype = settings.get("dtype", "float32")
            kv = "int8" if settings.get("kv_cache") == "int8" else dtype
            ready = f"dtype={dtype} .* kv_cache=\\d+ contexts in {kv} .* weights={settings.get('weights', 'dtype')} "
            # The tied head packed (or int8) apart, the embedding's rows read from the file: held once.
            ready += r"\(linear kernels \d+MB\) \(other \d+MB\) \(embedding read from the file \d+MB\) "
            assert re.search(rf"{good} ready: backend=eager {ready}", log)
            answer = generate(server, good, {"prompt": PROMPTS[0], "max_new_tokens": 8})
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] >= 1
        finally:
            server.stop()
        config = dataclasses.replace(config, models=[strict])
        with pytest.raises(ServerError, match="model load failed") as refused:
            start_ready(config, tmp_path / "strict", deadline_s=300, progress=lambda message: None)
        assert f"{precision} answers too far from the float model on held-out prompts: next-token distance mean" in str(
            refused.value
        )
    finally:
        for name in made:
            remove_model(name)


def test_an_openvino_variant_is_judged_when_built_and_not_installed_when_too_far(sources, tmp_path):
    """An openvino variant's IR is exported by `make archive` (model_store/openvino_lm.py) and, on
    int8 weights (compressed at export; computed in float32 here so that every CPU runs it) with
    an int8 KV cache (the CPU plugin's u8), judged there against the float model on held-out
    prompts: within the limits it is installed without the source's weights (the IR holds them)
    and serves; with a model file's stricter limit the build names what failed and installs
    nothing."""
    document = yaml.safe_load(model_file(QWEN).read_text())
    made = {
        "test-yours-lm-ov-int8": {"weights": "int8", "kv_cache": "int8"},
        "test-yours-lm-ov-int8-strict": {
            "weights": "int8",
            "kv_cache": "int8",
            "accuracy_tolerance": 1e-4,
            "accuracy_prompts": 4,
        },
    }
    for name, settings in made.items():
        model_file(name).write_text(
            yaml.safe_dump({**document, "handler": {**document.get("handler", {}), **settings}})
        )
    try:
        good, strict = made
        build = [sys.executable, "-m", "model_store.build", "--models", good, "--variants", "openvino"]
        done = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert re.search(
            rf"openvino/{good}: accuracy against float32 \(float32 on int8 weights with an int8 KV cache, judged in \d+s\): "
            r"greedy tokens [\d.]+% equal \(\d+ of \d+ positions, 8 prompts\)",
            done.stdout,
        ), done.stdout[-3000:]
        archive = Variant.load("openvino").archive(good)
        assert (archive / "openvino" / "openvino_model.xml").is_file() and not list(archive.rglob("*.safetensors"))
        config = ServeConfig.from_preset("optimized", variant="openvino", models=[good], cpus=one_cpu())
        server = start_server(tmp_path / "good", config)
        try:
            log = server.logs.model_log.read_text(errors="replace")
            assert re.search(
                rf"{good} ready: backend=openvino dtype=float32 .* kv_cache=\d+ contexts in int8 .* "
                "prefix_caching=off prompt_lookup=0 weights=int8 ",
                log,
            )
            answer = generate(server, good, {"prompt": PROMPTS[0], "max_new_tokens": 8, "ignore_eos": True})
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 8
        finally:
            server.stop()
        build[build.index(good)] = strict
        done = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert done.returncode != 0
        said = done.stdout + done.stderr
        # The stricter limit fails, named (the share of greedy tokens may fail before it, listed first).
        assert (
            f"openvino/{strict} is not installed: float32 on int8 weights with an int8 KV cache answers too far "
            "from the float model "
            "on held-out prompts: "
        ) in said
        assert re.search(r"next-token distance mean [\d.]+ > 0\.0001", said), said[-2000:]
        assert not Variant.load("openvino").archive(strict).exists()
    finally:
        for name in made:
            remove_model(name)


def test_a_bf16_openvino_variant_is_exported_with_float16_weights_judged_and_served(sources, tmp_path):
    """openvino-bf16's IR stores float16 weights, half of float32's (the CPU plugin packs its bf16
    copy from either, and the IR's pages stay mapped beside it): judged against the float model
    at build time and served. A CPU that cannot compute bf16 refuses the build and says why."""
    name = "test-yours-lm-ov-bf16"
    model_file(name).write_text(model_file(QWEN).read_text())
    try:
        build = [sys.executable, "-m", "model_store.build", "--models", name, "--variants", "openvino-bf16"]
        done = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=900)
        if refusal := cpu_refusal(DType.BFLOAT16):
            assert done.returncode != 0 and refusal in done.stdout + done.stderr
            return
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "(float16 weights)" in done.stdout
        assert re.search(rf"openvino-bf16/{name}: accuracy against float32 \(bfloat16, judged in \d+s\): ", done.stdout)
        ir = (Variant.load("openvino-bf16").archive(name) / "openvino" / "openvino_model.xml").read_text()
        constants = re.findall(r'<layer [^>]*type="Const"[^>]*>\s*<data element_type="(\w+)" shape="([^"]*)"', ir)
        large = {
            element for element, shape in constants if shape and torch.Size(map(int, shape.split(","))).numel() >= 256
        }
        assert large == {"f16"}, f"the weights' element types: {large}"
        config = ServeConfig.from_preset("optimized", variant="openvino-bf16", models=[name], cpus=one_cpu())
        server = start_server(tmp_path / "bf16", config)
        try:
            answer = generate(server, name, {"prompt": PROMPTS[0], "max_new_tokens": 8, "ignore_eos": True})
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 8
        finally:
            server.stop()
    finally:
        remove_model(name)


def test_int8_weights_compiled_serve_many_streams_without_recompiling(sources, tmp_path):
    """Inductor on int8 weights (the model file's `weights: int8`; computed in float32 here so that
    every CPU runs it, `inductor-bf16-woq` computes in bf16): the model's linear weights in int8
    (torchao), judged against float32, then compiled with them and warmed up: prompts of every
    length (chunked prefill), streams together and a chat all answered, with no request waiting
    for the compiler."""
    name = "test-yours-lm-int8-weights"
    document = yaml.safe_load(model_file(QWEN).read_text())
    model_file(name).write_text(yaml.safe_dump({**document, "handler": {**document["handler"], "weights": "int8"}}))
    try:
        build = [sys.executable, "-m", "model_store.build", "--models", name, "--variants", "inductor"]
        done = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        # One CPU: a worker with fewer threads than the build compiled with finds its graphs too.
        config = ServeConfig.from_preset("optimized", variant="inductor", models=[name], cpus=one_cpu())
        server = start_server(tmp_path / "int8", config)
        try:
            answers: dict[int, requests.Response] = {}

            def ask(index: int, prompt: str) -> None:
                answers[index] = generate(server, name, {"prompt": prompt, "max_new_tokens": 24})

            threads = [threading.Thread(target=ask, args=(i, p)) for i, p in enumerate(PROMPTS * 2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=300)
            assert [answers[i].status_code for i in range(len(threads))] == [200] * len(threads)
            assert all(answers[i].json()["usage"]["completion_tokens"] >= 1 for i in range(len(threads)))
            chat = generate(server, name, {"messages": CHAT, "max_tokens": 8}, "v1/chat/completions")
            assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["role"] == "assistant"
            log = server.logs.model_log.read_text(errors="replace")
            assert re.search(rf"{name}: \d+ linear layers on int8 weights", log)
            assert re.search(rf"{name} accuracy against float32: .* \(served in float32 on int8 weights\)", log)
            assert re.search(rf"{name}: the float model's answers on 8 held-out prompts .* read from the archive", log)
            assert f"{name} ready: backend=inductor dtype=float32 " in log
            assert "recompiled while serving" not in log, "a request waited for the compiler"
            assert_archive_graphs(server, name, log)
        finally:
            server.stop()
    finally:
        remove_model(name)
