"""`make bench PLAN=generate MODELS=lm`: a language model served by the kit against what a user would
run instead, streamed, at several concurrencies, in interleaved rounds.

    .venv/bin/python -m bench.generate --model lm [--rounds 3] [--seconds 60] [--concurrency 1,4,16]

Rows: the kit (TorchServe, `inductor` and, where the CPU computes bf16, `inductor-bf16`) and the
FastAPI + transformers `generate` peer (bench/generate_peer.py) at the same precisions, on the
model file's own directory. Every server runs at once; each round measures every row at every
concurrency, in a rotated order, with the same workload (bench/streams.py): a mix of prompt and
answer lengths, greedy, every answer its full length. The report gives medians over the rounds
and their spread: output tokens/s, time to first token and inter-token latency (p50, p99).
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

from bench.generate_peer import HEALTH_PATH, HOST
from bench.streams import Ask, StreamStats, measure_streams
from handlers.backends import DType, cpu_refusal
from handlers.calibration import SENTENCES
from kit.models import Model, Task
from kit.paths import ROOT, process_environment
from kit.ports import PORTS
from kit.serve_config import ServeConfig
from kit.server import Server, start_ready, terminate
from kit.topology import read_topology

RESULTS = ROOT / "bench" / "results"
PEER_READY_S = 600
STOP_TIMEOUT_S = 20
WARMUP_S = 10
# Prompts of about 20, 80 and 300 tokens, answers of 32 and 128: chat turns to RAG answers.
PROMPT_SENTENCES = (2, 8, 30)
ANSWER_TOKENS = (32, 128)


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
    url: str  # its OpenAI completions endpoint
    stop: Callable[[], None]


def kit_system(model: Model, variant: str, run_dir: Path) -> System:
    # One worker per L3 domain, its cores as threads (objective latency): every stream in one
    # engine's batch, the weights read once per step for all of them. The planner's default,
    # one single-threaded worker per core, would split the streams and read the weights per core.
    config = ServeConfig.from_preset("optimized", variant=variant, models=[model.name], objective="latency")
    server: Server = start_ready(config, run_dir / f"kit-{variant}", progress=log)
    url = server.api.url("inference", f"/predictions/{model.name}/1.0/v1/completions")
    return System(f"kit {variant}", url, server.stop)


def peer_system(model: Model, dtype: DType, run_dir: Path) -> System:
    (port,) = PORTS.take(1)
    log_file = open(run_dir / f"fastapi-{dtype.value}.log", "w")  # noqa: SIM115 - open while it runs
    command = [
        sys.executable,
        "-m",
        "bench.generate_peer",
        str(model.source.path),
        "--port",
        str(port),
        "--dtype",
        dtype.value,
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **process_environment({})},
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + PEER_READY_S
    while True:
        try:
            if requests.get(f"http://{HOST}:{port}{HEALTH_PATH}", timeout=2).ok:
                break
        except requests.RequestException:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the FastAPI peer did not start: {run_dir / log_file.name}")
        time.sleep(1)

    def stop() -> None:
        terminate([psutil.Process(process.pid)], STOP_TIMEOUT_S)
        log_file.close()

    return System(f"fastapi {dtype.value}", f"http://{HOST}:{port}/v1/completions", stop)


def median_stats(runs: list[StreamStats]) -> dict:
    def spread(values: list[float]) -> dict:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    return {
        "output_tokens_per_s": spread([r.output_tokens_per_s for r in runs]),
        "ttft_ms_p50": spread([r.ttft_ms.p50 for r in runs]),
        "ttft_ms_p99": spread([r.ttft_ms.p99 for r in runs]),
        "itl_ms_p50": spread([r.itl_ms.p50 for r in runs]),
        "itl_ms_p99": spread([r.itl_ms.p99 for r in runs]),
        "requests": sum(r.requests for r in runs),
        "errors": sum(r.errors for r in runs),
    }


def report(results: dict, out: Path, header: str) -> str:
    lines = [header, "", "| concurrency | row | output tokens/s (min–max) | × FastAPI same dtype | TTFT p50 ms | ITL p50 ms | ITL p99 ms | errors |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for concurrency, rows in results.items():
        for name, stats in rows.items():
            dtype = name.split()[-1].replace("inductor-bf16", "bfloat16").replace("inductor", "float32")
            peer = rows.get(f"fastapi {dtype}")
            tps = stats["output_tokens_per_s"]
            ratio = (
                f"{tps['median'] / peer['output_tokens_per_s']['median']:.2f}×"
                if peer and not name.startswith("fastapi")
                else ""
            )
            lines.append(
                f"| {concurrency} | {name} | {tps['median']:.1f} ({tps['min']:.1f}–{tps['max']:.1f}) | {ratio} | "
                f"{stats['ttft_ms_p50']['median']:.0f} | {stats['itl_ms_p50']['median']:.0f} | {stats['itl_ms_p99']['median']:.0f} | {stats['errors']} |"
            )  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a text-generation model file (make model NAME=... SRC=...)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--concurrency", default="1,4,16")
    args = parser.parse_args(argv)
    model = Model.load(args.model)
    if model.task is not Task.TEXT_GENERATION:
        log(f"ERROR: {args.model} is a {model.task.value} model; PLAN=generate measures text-generation models")
        return 2
    dtypes = [DType.FLOAT32] + ([] if cpu_refusal(DType.BFLOAT16) else [DType.BFLOAT16])
    variants = {DType.FLOAT32: "inductor", DType.BFLOAT16: "inductor-bf16"}
    build = [
        sys.executable,
        "-m",
        "model_store.build",
        "--models",
        model.name,
        "--variants",
        ",".join(variants[d] for d in dtypes),
    ]
    if subprocess.run(build, cwd=ROOT).returncode != 0:
        return 1
    out = RESULTS / f"generate-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    systems: list[System] = []
    results: dict[int, dict[str, list[StreamStats]]] = {c: {} for c in concurrencies}
    asks = workload()
    try:
        for dtype in dtypes:
            log(f"starting the kit ({variants[dtype]}) and the FastAPI peer ({dtype.value})")
            systems += [kit_system(model, variants[dtype], out), peer_system(model, dtype, out)]
        for system in systems:
            log(f"warming up {system.name}")
            measure_streams(system.url, model.name, asks, 2, WARMUP_S)
        for round_ in range(args.rounds):
            order = systems[round_ % len(systems) :] + systems[: round_ % len(systems)]
            for concurrency in concurrencies:
                for system in order:
                    stats = measure_streams(system.url, model.name, asks, concurrency, args.seconds)
                    results[concurrency].setdefault(system.name, []).append(stats)
                    log(f"round {round_ + 1}/{args.rounds} c={concurrency} {system.name}: {stats.output_tokens_per_s:.1f} "
                        f"tokens/s, TTFT p50 {stats.ttft_ms.p50:.0f} ms, ITL p50 {stats.itl_ms.p50:.0f} ms, {stats.errors} errors")  # fmt: skip
    except KeyboardInterrupt:
        log("interrupted: the report has the rows measured so far")
    finally:
        for system in systems:
            system.stop()
    summary = {c: {name: median_stats(runs) for name, runs in rows.items()} for c, rows in results.items() if rows}
    topology = read_topology()
    header = (
        f"# PLAN=generate: {model.name} ({model.source.location})\n\n`{' '.join(sys.argv)}`; {args.rounds} rounds of "
        f"{args.seconds:.0f} s per row and concurrency; CPU: {topology.model_name} ({len(topology.cpus)} CPUs usable)."
    )
    (out / "results.json").write_text(json.dumps({"command": sys.argv, "summary": summary}, indent=2))
    print(report(summary, out, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
