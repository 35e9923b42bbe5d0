"""In-process throughput of an archive's model: the same layout as a server row, without a server.

    measure_in_process(ServeConfig(...).variant.archive("resnet50"), ServeConfig(...), seconds=10)

One child process per worker, each with the worker's thread count, allocator (LD_PRELOAD)
and the cores the server would pin it to (the plan's, or the launcher's). Children load + optimize + warm up, report
ready, then all run for the same window on pre-built inputs; items/s are summed. The model
alone is timed: the gap to the served row is the serving cost (HTTP, decode, queueing).

Child mode (used by the parent): python -m bench.inprocess ARCHIVE_DIR --batch B --seconds S
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bench.results import Measured
from kit.layout import OmpWaitPolicy
from kit.models import omp_wait_policy
from kit.paths import ROOT, process_environment
from kit.pin_worker import allocator_library
from kit.properties import worker_environment
from kit.serve_config import Placement, ServeConfig
from kit.topology import read_topology

if TYPE_CHECKING:  # the parent process never imports torch: its children do
    from torch import nn

    from handlers.accuracy import Agreement
    from handlers.settings import OptimizationSettings


def child_environment(config: ServeConfig, threads: int, model: str) -> dict[str, str]:
    env = {**process_environment(dict(os.environ)), **worker_environment(config)}
    env["OMP_NUM_THREADS"] = str(threads)
    if (policy := omp_wait_policy(model)) is not None:  # the model's own over the preset's, as kit/pin_worker.py
        env.pop("OMP_WAIT_POLICY", None)
        if policy is not OmpWaitPolicy.DEFAULT:
            env["OMP_WAIT_POLICY"] = policy.value.upper()
    env.pop("LD_PRELOAD", None)
    library = allocator_library(config.variant.environment / "lib", config.served_allocator.value)
    if config.placement is not Placement.NONE and library:
        env["LD_PRELOAD"] = str(library)
    return env


def worker_cpus(config: ServeConfig, model: str) -> list[tuple[set[int], int]]:
    """(CPUs, threads) of each worker the server would start for `model`."""
    allowed = config.allowed_cpus
    if config.placement is Placement.PLAN:
        plan = config.layout(read_topology()).models[model]
        return [(set(w.cpus), w.threads) for w in plan.workers]
    if config.placement is Placement.LAUNCHER:  # worker i on cores i*threads.. of the host, as run_cpu does
        threads = config.threads or 1
        return [(set(range(rank * threads, (rank + 1) * threads)), threads) for rank in range(config.workers or 1)]
    return [(allowed, config.threads or len(allowed))] * (config.workers or len(allowed))


def measure_in_process(archive: Path, model: str, config: ServeConfig, seconds: int, work_dir: Path) -> Measured:
    """Summed items/s of concurrent model processes laid out like the server's workers, and
    the first one's agreement with float32 eager."""
    work_dir.mkdir(parents=True, exist_ok=True)
    children = []
    log_path = work_dir / f"in-process-{archive.parent.name}-{archive.name}.log"
    log_file = open(log_path, "a")  # noqa: SIM115 - closed in finally, after the children
    for cpus, threads in worker_cpus(config, model):
        # The variant's own environment: torch 2.8 for the ipex backends.
        python = config.variant.environment / "bin" / "python"
        command = [
            str(python),
            "-m",
            "bench.inprocess",
            str(archive),
            "--batch",
            str(config.batch_size),
            "--seconds",
            str(seconds),
            "--cpus",
            ",".join(map(str, sorted(cpus))),
        ]
        children.append(
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=child_environment(config, threads, model),
                text=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
            )
        )
    try:
        for child in children:
            line = child.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"in-process child failed before warm-up finished; see {log_path}")
        for child in children:  # start every worker's window together
            child.stdin.write("go\n")
            child.stdin.flush()
        results = [json.loads(child.stdout.readline()) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
        log_file.close()
    items_per_s = sum(r["items"] / r["seconds"] for r in results)
    first = results[0]
    return Measured(round(items_per_s, 2), first["cosine_mean"], first["cosine_min"], first["top1_agreement"])


def judged(settings: OptimizationSettings, run: Callable, reference: nn.Module, held_out: Sequence) -> Agreement:
    """`run`'s agreement with the float32 eager reference on the held-out inputs; exact, not
    measured, where the archive is that reference (a baseline row's): its inputs through both were
    most of that row's in-process time, 20 s of a 2 s window with the baseline's threads on 2 cores."""
    from handlers.accuracy import Agreement, agreement
    from handlers.backends import Backend, DType

    if settings.backend is Backend.EAGER and settings.dtype is DType.FLOAT32:
        return Agreement(cosine_mean=1.0, cosine_min=1.0, top1_agreement=1.0, probability_diff_max=0.0)
    return agreement(run, reference, held_out)


def run_child(model_dir: Path, batch: int, seconds: int, cpus: str) -> None:
    import torch

    from handlers.accuracy import HELD_OUT
    from handlers.archive import load_archived
    from handlers.backends.common import to_layout
    from handlers.optimize import optimize

    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    archived = load_archived(model_dir)
    # Converted once up front, in inference mode as a worker converts (Dynamo guards on
    # inference-tensor-ness): the timed loop's layout conversion is then a no-op.
    with torch.inference_mode():
        inputs = to_layout(archived.example(batch), archived.settings.channels_last)
    # Batch 1 as well: the accuracy inputs come one at a time (AOTInductor runs packaged sizes only).
    examples = [inputs] if batch == 1 else [archived.example(1), inputs]
    optimized = optimize(archived.model, archived.settings, examples, model_dir, archived.handler.samples.checks(1))
    agreed = judged(archived.settings, optimized, archived.model, archived.handler.samples.held_out(HELD_OUT))
    print("ready", flush=True)
    sys.stdin.readline()
    items = 0
    with torch.inference_mode():
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            optimized(*inputs)
            items += batch
        elapsed = time.perf_counter() - start
    print(json.dumps({"items": items, "seconds": elapsed, **dataclasses.asdict(agreed)}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--cpus", default="")
    args = parser.parse_args()
    run_child(args.model_dir, args.batch, args.seconds, args.cpus)
