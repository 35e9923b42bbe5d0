"""Where a served request's CPU goes: CPU time per request of each process group of a row,
from /proc before and after its measured ab run.

    group = lambda process: group_of(process, row.model)
    before, usage_before = process_cpu_s(server.process_tree(), group), children_cpu_s()  # ab: reaped children
    ... ab ...
    ms = per_request_ms(before, process_cpu_s(server.process_tree(), group), children_cpu_s() - usage_before, requests)
    # {"frontend": 1.2, "frontend JIT": 1.1, "workers": 11.2, "other workers": 0.3, "launchers": 0.0, "ab": 0.6}
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
from collections.abc import Callable
from pathlib import Path

import psutil

from handlers.archive_files import MANIFEST
from kit.pin_worker import is_worker
from kit.server import LAUNCHER_MODULE

LOAD_GENERATOR = "ab"


def group_of(process: psutil.Process, model: str) -> str:
    """TorchServe's Java frontend, this row's model's workers, other models' workers, launchers."""
    command = " ".join(process.cmdline())
    if process.name() == "java" or "org.pytorch.serve.ModelServer" in command:
        return FRONTEND
    if LAUNCHER_MODULE in command:
        return "launchers"
    if is_worker(process.cmdline()):
        # The command line names no model: a worker runs in its model's unpacked archive.
        return "workers" if model_of(process) == model else "other workers"
    return "other"  # the torchserve CLI wrapper


def model_of(process: psutil.Process) -> str:
    with contextlib.suppress(OSError, ValueError, KeyError, psutil.Error):
        return json.loads((Path(process.cwd()) / MANIFEST).read_text())["model"]["modelName"]
    return ""


FRONTEND, FRONTEND_JIT = "frontend", "frontend JIT"
# The JVM's just-in-time compilers' threads (/proc/PID/task/TID/comm): the frontend's warm-up, apart.
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")


def jit_cpu_s(pid: int) -> float:
    """CPU seconds of a JVM's compiler threads so far (0 when they cannot be read)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() in JIT_THREADS:
                    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                    fields = stat[stat.rindex(")") + 2 :].split()  # utime, stime: fields 14 and 15
                    total += (int(fields[11]) + int(fields[12])) / tick
    return total


def process_cpu_s(
    processes: list[psutil.Process], group: Callable[[psutil.Process], str]
) -> dict[tuple[int, str], tuple[str, float]]:
    """(pid, part) -> (group, CPU seconds so far); the frontend's JIT threads are a group of their own."""
    out = {}
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            name, seconds = group(process), times.user + times.system
            if name == FRONTEND:
                jit = jit_cpu_s(process.pid)
                out[(process.pid, "jit")] = (FRONTEND_JIT, jit)
                seconds -= jit
            out[(process.pid, "")] = (name, seconds)
    return out


def children_cpu_s() -> float:
    """CPU seconds of this process's reaped children (the ab runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def per_request_ms(
    before: dict[tuple[int, str], tuple[str, float]],
    after: dict[tuple[int, str], tuple[str, float]],
    ab_cpu_s: float,
    requests: int,
) -> dict[str, float]:
    """CPU ms per request by group; processes alive at both ends only (a restarted worker's
    replacement is missed: the soak, not the bench, is where restarts are looked at)."""
    totals: dict[str, float] = {}
    for key, (group, seconds) in after.items():
        if key in before:
            totals[group] = totals.get(group, 0.0) + seconds - before[key][1]
    totals[LOAD_GENERATOR] = ab_cpu_s
    return {group: round(1000 * seconds / max(1, requests), 2) for group, seconds in sorted(totals.items())}
