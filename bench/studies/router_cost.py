"""What the OpenAI router (kit/openai_router.py) costs a request: why it has a port of its own
rather than standing in front of TorchServe's inference port (`make bench-router`).

    .venv/bin/python -m bench.studies.router_cost [--models NAME] [--rounds 3] [--requests 300]

One server as `make serve` starts it, serving an embedder (--models, else the first of
config/models/ whose task is feature-extraction); in each round, in turns, `--requests`
sequential embeddings asked at the model's own path (`/predictions/<model>/1.0/v1/embeddings`)
and through the router (`:openai_port/v1/embeddings`), the same body. Per request: the wall time
and the router process's CPU time (user + system, from /proc). A proxy in front of the inference
port would add that CPU to every request of every model, classifiers included. Results:
bench/results/router-<time>/results.json and the table printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import psutil
import requests

from bench.results import RESULTS, study_report
from kit.models import Model, Task, model_names
from kit.serve_config import ServeConfig
from kit.server import start_ready
from kit.server_state import ServerState

BODY_TEXT = "a great movie with a long and winding plot"
WARMUP = 30


@dataclasses.dataclass(frozen=True)
class Turn:
    """One round's requests on one path."""

    path: str  # "direct" or "router"
    wall_ms: float  # per request
    router_cpu_ms: float  # per request


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure(session: requests.Session, url: str, body: dict, count: int, router: psutil.Process, path: str) -> Turn:
    before, started = cpu_seconds(router), time.perf_counter()
    for _ in range(count):
        answer = session.post(url, json=body, timeout=60)
        answer.raise_for_status()
    wall = time.perf_counter() - started
    return Turn(path, 1000 * wall / count, 1000 * (cpu_seconds(router) - before) / count)


def table(turns: list[Turn], header: str) -> str:
    """Medians over the rounds per path, and what the router adds."""
    lines = [header, "", "| path | wall ms / request (median) | router CPU ms / request (median) |", "|---|---|---|"]
    medians = {}
    for path in ("direct", "router"):
        mine = [t for t in turns if t.path == path]
        medians[path] = statistics.median(t.wall_ms for t in mine), statistics.median(t.router_cpu_ms for t in mine)
        lines.append(f"| {path} | {medians[path][0]:.2f} | {medians[path][1]:.3f} |")
    added = medians["router"][0] - medians["direct"][0]
    lines += ["", f"The router adds {added:.2f} ms a request and {medians['router'][1]:.3f} ms of its own CPU."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="", help="an embedder (default: the first feature-extraction model)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args(argv)
    embedders = [name for name in model_names() if Model.load(name).task is Task.FEATURE_EXTRACTION]
    model = args.models.split(",")[0] if args.models else next(iter(embedders), "")
    if not model:
        print("[router] ERROR: no feature-extraction model in config/models/; name one with MODELS=", file=sys.stderr)
        return 2
    out = RESULTS / f"router-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    server = start_ready(ServeConfig.from_preset("optimized", models=[model]), out / "server", progress=print)
    try:
        state = ServerState.load(server.run_dir)
        if state is None or state.router_pid is None:
            print("[router] ERROR: the server started no router (openai_port: 0?)", file=sys.stderr)
            return 1
        router = psutil.Process(state.router_pid)
        urls = {
            "direct": server.api.url("inference", f"/predictions/{model}/1.0/v1/embeddings"),
            "router": f"http://127.0.0.1:{server.config.openai_port}/v1/embeddings",
        }
        body = {"model": model, "input": BODY_TEXT}
        turns: list[Turn] = []
        with requests.Session() as session:
            for path, url in urls.items():
                measure(session, url, body, WARMUP, router, path)
            for round_ in range(args.rounds):
                for path in list(urls)[round_ % 2 :] + list(urls)[: round_ % 2]:  # rotated
                    turns.append(measure(session, urls[path], body, args.requests, router, path))
                    print(f"[router] round {round_ + 1}/{args.rounds} {path}: {turns[-1]}", flush=True)
    finally:
        server.stop()
    study_report(
        out,
        f"Router cost: {model}",
        f"{args.rounds} rounds of {args.requests} sequential requests per path",
        lambda header: table(turns, header),
        {"turns": turns},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
