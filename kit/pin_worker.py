#!/usr/bin/env python3
"""Start one TorchServe worker on the cores the layout plan gave it, then become that worker.

TorchServe runs `$PYTHON_EXECUTABLE ts/model_service_worker.py ...` for every worker, in the
model's extracted archive directory. The kit points PYTHON_EXECUTABLE here (kit/server.py):

1. the model is the one of the archive in the working directory (MAR-INF/MANIFEST.json);
2. its workers' slots are in the plan ($KIT_LAYOUT, written by the server at start); the worker
   takes the first free one by locking <run dir>/slots/<model>.<i>. The lock belongs to the open
   file, which exec keeps: it lasts exactly as long as the worker, so a worker that dies frees its
   slot and TorchServe's replacement lands on the same cores;
3. it execs `numactl --physcpubind=CPUS --membind=NODE $KIT_WORKER_PYTHON ...` (a worker over
   several nodes' cores: --interleave=all, over the nodes its CPU set may use) with
   OMP_NUM_THREADS, the model's own OpenMP wait policy if it has one, and its planned allocator
   preloaded: no process stays behind (TorchServe's own
   launcher, torch.backends.xeon.run_cpu, stays as a parent of every worker, ~225 MB each);
4. the worker it runs is the kit's (handlers/worker.py, in every archive the kit builds) in place
   of ts/model_service_worker.py: the same protocol without TorchServe's per-request extras.

Standard library only: it runs before every worker, so it must start fast.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from pathlib import Path

LAYOUT_VAR = "KIT_LAYOUT"  # the plan: run_dir/layout.json
PYTHON_VAR = "KIT_WORKER_PYTHON"  # the environment's python that runs the worker
ALLOCATOR_DIR_VAR = "KIT_ALLOCATOR_DIR"  # where lib<allocator>.so are: the environment's lib/
# A language model's planned sequences (the plan's "sequences"), read by the handler. Spelled here
# too, not imported: this script is standard library only (handlers.switches.PLANNED_SEQUENCES_VAR).
SEQUENCES_VAR = "KIT_MAX_SEQUENCES"
KV_CONTEXTS_VAR = "KIT_KV_CONTEXTS"  # and its KV cache's contexts (handlers.switches.PLANNED_KV_CONTEXTS_VAR)
# Allocator.DEFAULT's value (kit/plan.py), glibc malloc: nothing preloaded. Spelled out because
# this script imports nothing of the kit; tests/unit/kit/test_pin_worker.py keeps the two equal.
GLIBC_MALLOC = "default"
INTERLEAVED = -1  # kit/plan.py's: a worker whose cores span nodes (test_pin_worker keeps the two equal)
LIBGOMP_DEFAULT = "default"  # OmpWaitPolicy.DEFAULT's value (kit/plan.py): OMP_WAIT_POLICY unset
TS_WORKER = "model_service_worker.py"  # the script TorchServe's frontend starts
KIT_WORKER_MODULE = "handlers.worker"  # run with -m from the archive's directory, the worker's cwd
KIT_WORKER_FILE = Path("handlers") / "worker.py"


def allocator_library(lib_dir: Path, allocator: str) -> Path | None:
    """The library to preload for `allocator`; None for glibc malloc. make install links these
    names into every environment (TorchServe's launcher looks there too)."""
    return None if allocator == GLIBC_MALLOC else Path(lib_dir) / f"lib{allocator}.so"


def claim_slot(slots_dir: Path, model: str, count: int) -> tuple[int, int]:
    """(slot index, locked fd) of the first free slot; all taken (more workers than the plan
    has, e.g. while a dying worker still holds its lock) -> a shared one, by pid."""
    slots_dir.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        fd = os.open(slots_dir / f"{model}.{index}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.set_inheritable(fd, True)  # kept across exec: the worker holds it until it exits
        return index, fd
    return os.getpid() % count, -1


def is_worker(command: list[str]) -> bool:
    """Whether a process's command line is a TorchServe worker's, TorchServe's or the kit's."""
    return any(arg.endswith(TS_WORKER) for arg in command) or KIT_WORKER_MODULE in command


def worker_args(args: list[str], model_dir: Path) -> list[str]:
    """TorchServe's worker command (`ts/model_service_worker.py ARGS`) with the kit's worker module
    in place of its script, when the archive carries it (an archive built by the kit does)."""
    if args and args[0].endswith(TS_WORKER) and (model_dir / KIT_WORKER_FILE).is_file():
        return ["-m", KIT_WORKER_MODULE, *args[1:]]
    return args


def command(worker: dict, python: str, args: list[str]) -> list[str]:
    cpus = ",".join(map(str, worker["cpus"]))
    numactl = shutil.which("numactl")
    if numactl:
        node = worker["numa_node"]
        memory = "--interleave=all" if node == INTERLEAVED else f"--membind={node}"
        return [numactl, f"--physcpubind={cpus}", memory, python, *args]
    os.sched_setaffinity(0, set(worker["cpus"]))  # inherited across exec; memory left unbound
    return [python, *args]


def main(args: list[str]) -> None:
    python = os.environ[PYTHON_VAR]
    args = worker_args(args, Path.cwd())
    layout_file = Path(os.environ[LAYOUT_VAR])
    # handlers/archive_files.py's MANIFEST, spelled here: this script runs before the kit's root is
    # on the path (sys.path[0] is kit/), and it stays standard library only.
    model = json.loads(Path("MAR-INF/MANIFEST.json").read_text())["model"]["modelName"]
    plan = json.loads(layout_file.read_text())["models"].get(model)
    if plan is None:  # a model the plan does not know (registered later): unpinned, as TorchServe would
        os.execv(python, [python, *args])
    index, _ = claim_slot(layout_file.parent / "slots", model, len(plan["workers"]))
    worker = plan["workers"][index]
    env = dict(os.environ, OMP_NUM_THREADS=str(worker["threads"]), KIT_WORKER_SLOT=str(index))
    if plan.get("sequences"):
        env[SEQUENCES_VAR] = str(plan["sequences"])
        env[KV_CONTEXTS_VAR] = str(plan.get("kv_contexts") or plan["sequences"])
    if policy := plan.get("omp_wait_policy"):  # the model's own, over the server's (kit/plan.py)
        env.pop("OMP_WAIT_POLICY", None)
        if policy != LIBGOMP_DEFAULT:
            env["OMP_WAIT_POLICY"] = policy.upper()
    library = allocator_library(Path(env[ALLOCATOR_DIR_VAR]), plan["allocator"])  # per model: its backend's
    if library:
        env["LD_PRELOAD"] = " ".join(filter(None, [str(library), env.get("LD_PRELOAD", "")]))
    argv = command(worker, python, args)
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    main(sys.argv[1:])
