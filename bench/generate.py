"""`make bench PLAN=generate MODELS=lm`: a language model served by the kit against what a user would
run instead, streamed, at several concurrencies, in interleaved rounds.

    .venv/bin/python -m bench.generate --model lm[,lm-other] [--rounds 3] [--seconds 60] [--concurrency 1,4,16]
        [--peers fastapi,llama.cpp,openvino]

Rows, on the model file's own directory: the kit (TorchServe, `inductor` and, where the CPU
computes bf16, `inductor-bf16`); the FastAPI + transformers `generate` peer (bench/generate_peer.py)
at the same precisions; llama.cpp's server (bench/llama_cpp.py: built from PyPI's llama-cpp-python
source, the GGUF converted from the same directory) at the same precisions and at Q8_0, with as
many parallel slots and as much context per slot as the kit serves. Several model files (the same
directory with other handler settings, e.g. `prefill_chunk`) are each a kit row of their own, in
the same rounds; the peers serve the first one's directory. Every server runs at once;
each round measures every row at every concurrency, in a rotated order, with the same workload
(bench/streams.py): a mix of prompt and answer lengths, greedy, every answer its full length.
The report gives medians over the rounds and their spread: output tokens/s, time to first token
and inter-token latency (p50, p99), and each row against FastAPI's and llama.cpp's at its precision.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import requests

from bench import llama_cpp, openvino_genai
from bench.completions import HEALTH_PATH, HOST
from bench.streams import Ask, StreamStats, measure_streams
from handlers.backends import DType, cpu_refusal
from handlers.calibration import SENTENCES
from handlers.settings import GenerationSettings
from kit.kv_cache import archive_settings
from kit.models import Model, Task
from kit.paths import ROOT, process_environment
from kit.ports import PORTS
from kit.serve_config import ServeConfig
from kit.server import Server, start_ready, terminate
from kit.topology import read_topology
from kit.variant import Variant

RESULTS = ROOT / "bench" / "results"
PEER_READY_S = 600
STOP_TIMEOUT_S = 20
WARMUP_S = 10
# Prompts of about 20, 80 and 300 tokens, answers of 32 and 64: chat turns to RAG answers. A row
# lasts until its last answer ends, and an unbatched peer writes 16 answers at once slowly.
PROMPT_SENTENCES = (2, 8, 30)
ANSWER_TOKENS = (32, 64)


def log(message: str) -> None:
    print(f"[bench] {message}", flush=True)


def workload() -> list[Ask]:
    asks = []
    for index, sentences in enumerate(PROMPT_SENTENCES):
        prompt = " ".join(SENTENCES[(index + i) % len(SENTENCES)] for i in range(sentences))
        asks += [Ask(prompt, tokens) for tokens in ANSWER_TOKENS]
    return asks


@dataclasses.dataclass
class System:
    name: str
    server: str  # KIT, or a key of PEERS
    precision: str  # of its weights: a DType's value, or a quantization ("q8_0")
    url: str  # its OpenAI completions endpoint
    stop: Callable[[], None]
    model: str  # the name its requests give


KIT = "kit"
# The kit's variant per precision.
VARIANTS = {DType.FLOAT32: "inductor", DType.BFLOAT16: "inductor-bf16"}
LLAMA_QUANTIZED = "q8_0"  # llama.cpp's int8 weights: what its users serve; the kit has none yet


def served_settings(model: Model) -> GenerationSettings:
    """What the kit's fp32 archive (always built) serves: its sequences and context size a peer's."""
    return archive_settings(Variant.load(VARIANTS[DType.FLOAT32]).archive(model.name))


def kit_system(model: Model, dtype: DType, run_dir: Path, named: bool = False) -> System:
    # The optimized preset as `make serve` starts it: the plan gives a language model one worker
    # (or one per L3 domain, batching: async), its cores as threads (kit/plan.py), every stream in
    # one engine's batch.
    variant = VARIANTS[dtype]
    config = ServeConfig.from_preset("optimized", variant=variant, models=[model.name])
    row = f"{KIT} {model.name} {variant}" if named else f"{KIT} {variant}"  # named: several kit models
    server: Server = start_ready(config, run_dir / row.replace(" ", "-"), progress=log)
    return System(row, KIT, dtype.value, completions_url(server, model.name), server.stop, model.name)


def completions_url(server: Server, model: str) -> str:
    """The kit's OpenAI completions endpoint for `model`."""
    return server.api.url("inference", f"/predictions/{model}/1.0/v1/completions")


class ExitedAtStart(RuntimeError):
    """A server's process ended before it answered its health check."""


def started(name: str, command: list[str], log_path: Path, port: int) -> Callable[[], None]:
    """`command` started and answering on `port`'s health path; the function that stops it."""
    log_file = open(log_path, "w")  # noqa: SIM115 - open while it runs
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **process_environment({})},
        start_new_session=True,
    )  # fmt: skip

    def stop() -> None:
        terminate([psutil.Process(process.pid)], STOP_TIMEOUT_S)
        log_file.close()

    deadline = time.monotonic() + PEER_READY_S
    while True:
        try:
            if requests.get(f"http://{HOST}:{port}{HEALTH_PATH}", timeout=2).ok:
                return stop
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
    command = [sys.executable, "-m", "bench.generate_peer", str(model.source.path), "--port", str(port),
               "--dtype", precision]  # fmt: skip
    stop = started("the FastAPI peer", command, run_dir / f"fastapi-{precision}.log", port)
    url = f"http://{HOST}:{port}/v1/completions"
    return System(f"fastapi {precision}", "fastapi", precision, url, stop, model.name)


def llama_system(model: Model, precision: str, run_dir: Path) -> System:
    gguf_type = llama_cpp.GGUF_TYPES[precision]
    gguf = llama_cpp.convert(model.source.path, gguf_type)
    settings, topology = served_settings(model), read_topology()
    (port,) = PORTS.take(1)
    command = llama_cpp.server_command(
        llama_cpp.server_binary(topology), gguf, port, settings.max_sequences, settings.context_length,
        topology.capacity,
    )  # fmt: skip
    name = f"llama.cpp {gguf_type}"
    try:
        stop = started(name, command, run_dir / f"llama.cpp-{gguf_type}.log", port)
    except ExitedAtStart as error:
        # llama.cpp's AMX kernels, used on repacked weights, crash at start on some hosts
        # (ggml-org/llama.cpp#20824: a segfault in ggml_backend_amx_mul_mat, Q8_0 on this VM's
        # Xeon). Without repacking they are not used; the row's name says so.
        log(f"{error}; starting it again with {llama_cpp.NO_REPACK}")
        name += f" {llama_cpp.NO_REPACK}"
        command.append(llama_cpp.NO_REPACK)
        stop = started(name, command, run_dir / f"llama.cpp-{gguf_type}{llama_cpp.NO_REPACK}.log", port)
    return System(name, "llama.cpp", precision, f"http://{HOST}:{port}/v1/completions", stop, model.name)


def openvino_system(model: Model, precision: str, run_dir: Path) -> System:
    """OpenVINO GenAI at the kit's precision (fp32 weights, computed in it), or on int8 weights at
    the CPU plugin's own precision."""
    int8 = precision == openvino_genai.INT8
    ir = openvino_genai.export(model.source.path, openvino_genai.INT8 if int8 else "fp32")
    settings = served_settings(model)
    config = json.loads((model.source.path / "config.json").read_text())
    cache = openvino_genai.cache_gb(config, settings.max_sequences, settings.context_length)
    (port,) = PORTS.take(1)
    command = openvino_genai.server_command(ir, port, None if int8 else precision, settings.max_sequences, cache)
    name = f"openvino {precision}"
    stop = started(name, command, run_dir / f"openvino-{precision}.log", port)
    return System(name, "openvino", precision, f"http://{HOST}:{port}/v1/completions", stop, model.name)


@dataclasses.dataclass(frozen=True)
class Peer:
    start: Callable[[Model, str, Path], System]
    extra: tuple[str, ...] = ()  # precisions it serves besides the kit's


# A peer's rows start after the kit's, in this order.
PEERS = {
    "fastapi": Peer(fastapi_system),
    "llama.cpp": Peer(llama_system, (LLAMA_QUANTIZED,)),
    "openvino": Peer(openvino_system, (openvino_genai.INT8,)),
}


def median_stats(runs: list[StreamStats]) -> dict:
    def spread(values: list[float]) -> dict:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    return {
        "output_tokens_per_s": spread([r.output_tokens_per_s for r in runs]),
        "ttft_ms_p50": spread([r.ttft_ms.p50 for r in runs]),
        "ttft_ms_p99": spread([r.ttft_ms.p99 for r in runs]),
        "itl_ms_p50": spread([r.itl_ms.p50 for r in runs]),
        "itl_ms_p99": spread([r.itl_ms.p99 for r in runs]),
        # Each round measures every row: a ratio between rows is taken round by round.
        "output_tokens_per_s_by_round": [r.output_tokens_per_s for r in runs],
        "requests": sum(r.requests for r in runs),
        "errors": sum(r.errors for r in runs),
    }


def ratio(stats: dict, peer: dict | None) -> str:
    """The median of the per-round ratios of output tokens/s, and their spread: hosts drift by
    ±20 % over a run, and a ratio of medians can pair one row's good round with another's bad."""
    if not peer:
        return ""
    # An interrupted run's last round may lack a row: pairs end with the shorter list.
    pairs = zip(stats["output_tokens_per_s_by_round"], peer["output_tokens_per_s_by_round"], strict=False)
    rounds = [ours / theirs for ours, theirs in pairs if theirs]
    if not rounds:
        return ""
    return f"{statistics.median(rounds):.2f}× ({min(rounds):.2f}–{max(rounds):.2f})"


PEER_NAMES = {"fastapi": "FastAPI", "llama.cpp": "llama.cpp", "openvino": "OpenVINO GenAI"}


def report(results: dict, systems: dict[str, System], out: Path, header: str) -> str:
    """A row per server and concurrency; each kit row against each peer's row at its precision."""
    peers = [peer for peer in PEERS if any(system.server == peer for system in systems.values())]
    ratios = "".join(f" × {PEER_NAMES[peer]}, by round (min–max) |" for peer in peers)
    lines = [header, "", f"| concurrency | row | output tokens/s (min–max) |{ratios} TTFT p50 ms | ITL p50 ms | ITL p99 ms | errors |",
             "|---|---|---|" + "---|" * len(peers) + "---|---|---|---|"]  # fmt: skip
    for concurrency, rows in results.items():
        for name, stats in rows.items():
            precision = systems[name].precision
            same = {systems[row].server: rows[row] for row in rows if systems[row].precision == precision}
            kit = systems[name].server == KIT
            tps = stats["output_tokens_per_s"]
            against = "".join(f" {ratio(stats, same.get(peer)) if kit else ''} |" for peer in peers)
            lines.append(
                f"| {concurrency} | {name} | {tps['median']:.1f} ({tps['min']:.1f}–{tps['max']:.1f}) |{against} "
                f"{stats['ttft_ms_p50']['median']:.0f} | {stats['itl_ms_p50']['median']:.0f} | {stats['itl_ms_p99']['median']:.0f} | {stats['errors']} |"
            )  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", required=True, help="text-generation model files, comma-separated (make model NAME=... SRC=...)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"of {', '.join(PEERS)}")
    args = parser.parse_args(argv)
    models = [Model.load(name) for name in args.model.split(",") if name]
    if others := [f"{m.name} ({m.task.value})" for m in models if m.task is not Task.TEXT_GENERATION]:
        log(f"ERROR: PLAN=generate measures text-generation models, not {', '.join(others)}")
        return 2
    model = models[0]  # the peers serve its directory
    peers = [peer for peer in args.peers.split(",") if peer]
    if unknown := sorted(set(peers) - set(PEERS)):
        log(f"ERROR: no peer {unknown}; PEERS= takes {', '.join(PEERS)}")
        return 2
    dtypes = [DType.FLOAT32] + ([] if cpu_refusal(DType.BFLOAT16) else [DType.BFLOAT16])
    build = [sys.executable, "-m", "model_store.build", "--models", ",".join(m.name for m in models),
             "--variants", ",".join(VARIANTS[d] for d in dtypes)]  # fmt: skip
    if subprocess.run(build, cwd=ROOT).returncode != 0:
        return 1
    out = RESULTS / f"generate-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    systems: list[System] = []
    results: dict[int, dict[str, list[StreamStats]]] = {c: {} for c in concurrencies}
    asks = workload()
    try:
        for served in models:
            for dtype in dtypes:
                started_at = time.monotonic()
                systems.append(kit_system(served, dtype, out, named=len(models) > 1))
                log(f"{systems[-1].name}: its worker started in {time.monotonic() - started_at:.0f} s")
        for peer in peers:
            for precision in [d.value for d in dtypes] + list(PEERS[peer].extra):
                log(f"starting {peer} at {precision}")
                systems.append(PEERS[peer].start(model, precision, out))
        for system in systems:
            log(f"warming up {system.name}")
            measure_streams(system.url, system.model, asks, 2, WARMUP_S)
        for round_ in range(args.rounds):
            order = systems[round_ % len(systems) :] + systems[: round_ % len(systems)]
            for concurrency in concurrencies:
                for system in order:
                    stats = measure_streams(system.url, system.model, asks, concurrency, args.seconds)
                    results[concurrency].setdefault(system.name, []).append(stats)
                    log(f"round {round_ + 1}/{args.rounds} c={concurrency} {system.name}: {stats.summary()}")
    except KeyboardInterrupt:
        log("interrupted: the report has the rows measured so far")
    finally:
        for system in systems:
            system.stop()
    summary = {c: {name: median_stats(runs) for name, runs in rows.items()} for c, rows in results.items() if rows}
    by_name = {system.name: system for system in systems}
    topology = read_topology()
    header = (
        f"# PLAN=generate: {', '.join(m.name for m in models)} ({model.source.location})\n\n`{' '.join(sys.argv)}`; {args.rounds} rounds of "
        f"{args.seconds:.0f} s per row and concurrency; CPU: {topology.model_name} ({len(topology.cpus)} CPUs usable)."
    )
    (out / "results.json").write_text(
        json.dumps(
            {
                "command": sys.argv,
                "rows": {s.name: {"server": s.server, "precision": s.precision} for s in systems},
                "summary": summary,
            },
            indent=2,
        )
    )
    print(report(summary, by_name, out, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
