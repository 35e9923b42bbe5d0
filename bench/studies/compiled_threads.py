"""What a language model's kernels pay for reading their thread count when they run: a decode
step's time with Inductor's kernels specialised for the threads they were compiled under, and with
them dynamic (what the kit compiles: handlers/generation/compiled.py), `make bench-threads MODELS=lm`.

    .venv/bin/python -m bench.studies.compiled_threads --models lm [--rounds 15] [--threads 1,2]

Per thread count, a process of its own computing with that many threads loads the model's source
in float32 with its linear weights packed (as a worker does) and compiles two copies of its forward
as a worker does, one each way. It then times decode steps of both in alternation (the order
swapped each round), at 2 and 16 rows over 320 cached positions: per round the mean of 5 steps
each way, and their ratio. Rows and positions are the engine's own (handlers/generation/runner.py,
cache.py). Results: bench/results/threads-<time>/results.json, report.md and the table printed.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

from bench.results import RESULTS, study_report
from kit.models import Model, Task
from kit.paths import ROOT, process_environment

ROWS = (2, 16)
POSITION = 300  # each row's position (a span of 320 cached positions: runner.SPAN_STEP)
STEPS = 5  # decode steps per timing
MODES = {"fixed": {"cpp.dynamic_threads": False}, "dynamic": {"cpp.dynamic_threads": True}}


@dataclasses.dataclass(frozen=True)
class Timing:
    threads: int
    rows: int
    fixed_ms: list[float]  # a decode step's mean time per round
    dynamic_ms: list[float]

    @property
    def ratios(self) -> list[float]:
        return [d / f for f, d in zip(self.fixed_ms, self.dynamic_ms, strict=True)]


def measure(source: str, rounds: int) -> list[Timing]:
    """In this process, with its threads: both compiles of the model, timed in alternation."""
    import torch
    from transformers import AutoModelForCausalLM

    from handlers.generation import compiled
    from handlers.generation.cache import KvShape, SlotCache
    from handlers.generation.packed_linear import pack_linears
    from handlers.generation.runner import Runner

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    pack_linears(model)
    runners = {}
    with torch.inference_mode():
        for mode, options in MODES.items():
            copied = copy.deepcopy(model)
            copied.forward = compiled.compile_traced(copied, options)
            cache = SlotCache(KvShape.of(model.config), slots=max(ROWS), context=2048, dtype=torch.float32)
            runners[mode] = Runner(copied, cache, 2048)
            started = time.monotonic()
            for rows in ROWS:
                for _ in range(2):
                    runners[mode].decode([0] * rows, [POSITION] * rows)
            took = time.monotonic() - started
            print(f"[threads] {torch.get_num_threads()} threads, {mode}: compiled in {took:.0f} s", file=sys.stderr)
        times = {(mode, rows): [] for mode in MODES for rows in ROWS}
        for number in range(rounds):
            order = list(MODES) if number % 2 == 0 else list(reversed(MODES))
            for rows in ROWS:
                for mode in order:
                    started = time.perf_counter()
                    for _ in range(STEPS):
                        runners[mode].decode([0] * rows, [POSITION] * rows)
                    times[mode, rows].append(1000 * (time.perf_counter() - started) / STEPS)
    threads = torch.get_num_threads()
    return [Timing(threads, rows, times["fixed", rows], times["dynamic", rows]) for rows in ROWS]


def table(timings: list[Timing], header: str) -> str:
    lines = [
        header,
        "",
        "| threads | rows | fixed: ms a step | dynamic: ms a step | dynamic ÷ fixed, median of rounds (min–max) |",
        "|---|---|---|---|---|",
    ]
    for t in timings:
        ratios = t.ratios
        lines.append(
            f"| {t.threads} | {t.rows} | {statistics.median(t.fixed_ms):.1f} | {statistics.median(t.dynamic_ms):.1f} "
            f"| {statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", required=True, help="a text-generation model file (make model NAME=... SRC=...)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--threads", default="", help="thread counts, comma-separated (default: 1 and every CPU usable)"
    )
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args(argv)
    name = args.models.split(",")[0]
    model = Model.load(name)
    if model.task is not Task.TEXT_GENERATION:
        print(f"[threads] ERROR: {name} is a {model.task.value} model; name a text-generation one", file=sys.stderr)
        return 2
    if args.measure:
        print(json.dumps([dataclasses.asdict(t) for t in measure(str(model.source.path), args.rounds)]))
        return 0
    from handlers.generation.runner import span
    from kit.topology import read_topology

    usable = len(read_topology().cpus)
    counts = [int(c) for c in args.threads.split(",")] if args.threads else sorted({1, usable})
    out = RESULTS / f"threads-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    timings: list[Timing] = []
    for threads in counts:
        # A process per count: a kernel compiled fixed is specialised for its process's threads.
        environment = {**process_environment(os.environ), "OMP_NUM_THREADS": str(threads)}
        command = [sys.executable, "-m", "bench.studies.compiled_threads", "--models", name, "--measure"]
        command += ["--rounds", str(args.rounds)]
        done = subprocess.run(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            print(f"[threads] ERROR: measuring with {threads} threads failed (exit {done.returncode})", file=sys.stderr)
            return 1
        timings += [Timing(**t) for t in json.loads(done.stdout.strip().splitlines()[-1])]
    study_report(
        out,
        f"Dynamic threads in a language model's kernels: {name}",
        f"{args.rounds} rounds of {STEPS} decode steps each way, float32, {span(POSITION + 1, 2048)} cached positions",
        lambda header: table(timings, header),
        {"timings": timings},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
