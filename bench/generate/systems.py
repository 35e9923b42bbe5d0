"""The servers PLAN=generate measures (bench/generate/run.py), each started and answering its
health check: the kit as `make serve` starts it, and its peers on the same model directory."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import requests

from bench.generate import llama_cpp, openvino_genai
from bench.generate.completions import HEALTH_PATH, HOST
from handlers.backends import Backend, DType
from handlers.generation.settings import GenerationSettings
from kit.kv_cache import archive_settings
from kit.models import Model
from kit.paths import ROOT, process_environment
from kit.ports import PORTS
from kit.procinfo import terminate
from kit.serve_config import ServeConfig
from kit.server import Server, start_ready
from kit.topology import read_topology
from kit.variant import Variant
from model_store import openvino_lm

PEER_READY_S = 600
STOP_TIMEOUT_S = 20


def log(message: str) -> None:
    print(f"[bench] {message}", flush=True)


@dataclasses.dataclass
class System:
    name: str
    server: str  # KIT, or a key of PEERS
    precision: str  # FLOAT32, BFLOAT16 or INT8: rows of one precision are compared
    url: str  # its OpenAI completions endpoint
    stop: Callable[[], None]
    model: str  # the name its requests give
    # Its root processes: its memory is their trees' (bench/generate/memory.py). The kit's are
    # TorchServe's and the OpenAI router's, which a user of `make serve` runs beside it.
    pids: tuple[int, ...] = ()


KIT = "kit"
FLOAT32, BFLOAT16 = DType.FLOAT32.value, DType.BFLOAT16.value
INT8 = "int8"  # int8 weights: the kit's weight-only variants, llama.cpp's Q8_0, OpenVINO's compressed IR
INDUCTOR, OPENVINO = Backend.INDUCTOR.value, Backend.OPENVINO.value  # the kit's LM backends measured (BACKENDS=)
# Every server's KV cache per precision of a row: the kit's (the served dtype; int8 weights compute
# in bf16), set explicitly on each peer, in the spelling llama.cpp and OpenVINO share: neither
# peer's default (llama.cpp's f16 holds half of fp32's bytes per position; OpenVINO's CPU plugin
# keeps 8 bits).
KV_TYPES = {FLOAT32: "f32", BFLOAT16: "bf16", INT8: "bf16"}
# The kit's variant per backend and precision. int8 weights are computed in bfloat16: in float32,
# torch's int8 product is far slower than float32's own (docs/generation.md), so a CPU without
# bf16 has no int8 row; OpenVINO's rows follow the same precisions.
KIT_VARIANTS = {
    INDUCTOR: {FLOAT32: "inductor", BFLOAT16: "inductor-bf16", INT8: "inductor-bf16-woq"},
    OPENVINO: {FLOAT32: "openvino", BFLOAT16: "openvino-bf16", INT8: "openvino-bf16-woq"},
}


def kit_variants(backend: str = INDUCTOR) -> dict[str, str]:
    """The kit's variant per precision this CPU serves, on `backend`."""
    return {precision: name for precision, name in KIT_VARIANTS[backend].items() if not Variant.load(name).refusal()}


def served_settings(model: Model) -> GenerationSettings:
    """What the kit's fp32 archive (always built) serves: its sequences and context size a peer's."""
    return archive_settings(Variant.load(KIT_VARIANTS[INDUCTOR][FLOAT32]).archive(model.name))


def kit_system(model: Model, variant: str, precision: str, run_dir: Path, named: bool = False) -> System:
    # The optimized preset as `make serve` starts it: the plan gives a language model one worker
    # (or one per L3 domain, batching: async), its cores as threads (kit/plan.py), every stream in
    # one engine's batch.
    config = ServeConfig.from_preset("optimized", variant=variant, models=[model.name])
    row = f"{KIT} {model.name} {variant}" if named else f"{KIT} {variant}"  # named: several kit models
    server: Server = start_ready(config, run_dir / row.replace(" ", "-"), progress=log)
    return System(
        row,
        KIT,
        precision,
        completions_url(server, model.name),
        server.stop,
        model.name,
        tuple(pid for pid in (server.pid, server.router_pid) if pid is not None),
    )


def completions_url(server: Server, model: str) -> str:
    """The kit's OpenAI completions endpoint for `model`."""
    return server.api.url("inference", f"/predictions/{model}/1.0/v1/completions")


class ExitedAtStart(RuntimeError):
    """A server's process ended before it answered its health check."""


def started(name: str, command: list[str], log_path: Path, port: int) -> tuple[Callable[[], None], int]:
    """`command` started and answering on `port`'s health path; the function that stops it, and its pid."""
    log_file = open(log_path, "w")  # noqa: SIM115 - open while it runs
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env={**os.environ, **process_environment({})},
        start_new_session=True,
    )

    def stop() -> None:
        terminate([psutil.Process(process.pid)], STOP_TIMEOUT_S)
        log_file.close()

    deadline = time.monotonic() + PEER_READY_S
    while True:
        try:
            if requests.get(f"http://{HOST}:{port}{HEALTH_PATH}", timeout=2).ok:
                return stop, process.pid
        except requests.RequestException:
            pass
        if process.poll() is not None:
            log_file.close()
            raise ExitedAtStart(f"{name} exited ({process.returncode}) while starting: {log_path}")
        if time.monotonic() > deadline:
            stop()
            raise RuntimeError(f"{name} did not start in {PEER_READY_S} s: {log_path}")
        time.sleep(1)


def fastapi_system(model: Model, precision: str, run_dir: Path) -> System:
    (port,) = PORTS.take(1)
    command = [
        sys.executable,
        "-m",
        "bench.generate.fastapi_peer",
        str(model.source.path),
        "--port",
        str(port),
        "--dtype",
        precision,
    ]
    stop, pid = started("the FastAPI peer", command, run_dir / f"fastapi-{precision}.log", port)
    url = f"http://{HOST}:{port}/v1/completions"
    return System(f"fastapi {precision}", "fastapi", precision, url, stop, model.name, (pid,))


def llama_system(model: Model, precision: str, run_dir: Path) -> System:
    gguf_type = llama_cpp.GGUF_TYPES[precision]
    gguf = llama_cpp.convert(model.source.path, gguf_type)
    settings, topology = served_settings(model), read_topology()
    (port,) = PORTS.take(1)
    command = llama_cpp.server_command(
        llama_cpp.server_binary(topology),
        gguf,
        port,
        settings.max_sequences,
        settings.context_length,
        topology.capacity,
        KV_TYPES[precision],
    )
    name = f"llama.cpp {gguf_type} kv {KV_TYPES[precision]}"
    try:
        stop, pid = started(name, command, run_dir / f"llama.cpp-{gguf_type}.log", port)
    except ExitedAtStart as error:
        # llama.cpp's AMX kernels, used on repacked weights, crash at start on some hosts
        # (ggml-org/llama.cpp#20824: a segfault in ggml_backend_amx_mul_mat, Q8_0 on this VM's
        # Xeon). Without repacking they are not used; the row's name says so.
        log(f"{error}; starting it again with {llama_cpp.NO_REPACK}")
        name += f" {llama_cpp.NO_REPACK}"
        command.append(llama_cpp.NO_REPACK)
        stop, pid = started(name, command, run_dir / f"llama.cpp-{gguf_type}{llama_cpp.NO_REPACK}.log", port)
    return System(name, "llama.cpp", precision, f"http://{HOST}:{port}/v1/completions", stop, model.name, (pid,))


def openvino_system(model: Model, precision: str, run_dir: Path) -> System:
    """OpenVINO GenAI at the kit's precision, from the IR the kit's own openvino variant of that
    precision is exported as (openvino_lm.ir_weights), or on int8 weights at the CPU plugin's own
    precision."""
    int8 = precision == INT8
    ir = openvino_genai.export(model.source.path, openvino_lm.ir_weights(precision, int8))
    settings = served_settings(model)
    config = json.loads((model.source.path / "config.json").read_text())
    kv = KV_TYPES[precision]
    cache = openvino_genai.cache_gb(config, settings.max_sequences, settings.context_length, kv)
    (port,) = PORTS.take(1)
    command = openvino_genai.server_command(ir, port, None if int8 else precision, settings.max_sequences, cache, kv)
    name = f"openvino {precision} kv {kv}"
    stop, pid = started(name, command, run_dir / f"openvino-{precision}.log", port)
    return System(name, "openvino", precision, f"http://{HOST}:{port}/v1/completions", stop, model.name, (pid,))


@dataclasses.dataclass(frozen=True)
class Peer:
    title: str  # its name in the report
    start: Callable[[Model, str, Path], System]
    precisions: frozenset[str]  # those it serves: it has a row at each the kit has


# A peer's rows start after the kit's, in this order.
PEERS = {
    # What a user writes: transformers' generate at the model's float precisions.
    "fastapi": Peer("FastAPI", fastapi_system, frozenset({FLOAT32, BFLOAT16})),
    "llama.cpp": Peer("llama.cpp", llama_system, frozenset({FLOAT32, BFLOAT16, INT8})),
    "openvino": Peer("OpenVINO GenAI", openvino_system, frozenset({FLOAT32, BFLOAT16, INT8})),
}
