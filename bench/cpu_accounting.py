"""Where a served request's CPU goes: CPU time per request of each process group of a row,
from /proc before and after its measured ab run.

    group = lambda process: group_of(process, row.model)
    before, usage_before = process_cpu_s(server.process_tree(), group), children_cpu_s()  # ab: reaped children
    ... ab ...
    ms = per_request_ms(before, process_cpu_s(server.process_tree(), group), children_cpu_s() - usage_before, requests)
    # {"frontend": 4.9, "workers": 11.2, "other workers": 0.3, "launchers": 0.0, "ab": 0.6}
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
from collections.abc import Callable

import psutil

from kit.server import LAUNCHER_MODULE

LOAD_GENERATOR = "ab"


def group_of(process: psutil.Process, model: str) -> str:
    """TorchServe's Java frontend, this row's model's workers, other models' workers, launchers."""
    command = " ".join(process.cmdline())
    if process.name() == "java" or "org.pytorch.serve.ModelServer" in command:
        return "frontend"
    if LAUNCHER_MODULE in command:
        return "launchers"
    if "model_service_worker.py" in command:
        # The command line names no model: a worker runs in its model's unpacked archive.
        return "workers" if model_of(process) == model else "other workers"
    return "other"  # the torchserve CLI wrapper


def model_of(process: psutil.Process) -> str:
    with contextlib.suppress(OSError, ValueError, KeyError, psutil.Error):
        manifest = os.path.join(process.cwd(), "MAR-INF", "MANIFEST.json")
        with open(manifest) as file:
            return json.load(file)["model"]["modelName"]
    return ""


def process_cpu_s(
    processes: list[psutil.Process], group: Callable[[psutil.Process], str]
) -> dict[int, tuple[str, float]]:
    """pid -> (group, CPU seconds so far)."""
    out = {}
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            out[process.pid] = (group(process), times.user + times.system)
    return out


def children_cpu_s() -> float:
    """CPU seconds of this process's reaped children (the ab runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def per_request_ms(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], ab_cpu_s: float, requests: int
) -> dict[str, float]:
    """CPU ms per request by group; processes alive at both ends only (a restarted worker's
    replacement is missed: the soak, not the bench, is where restarts are looked at)."""
    totals: dict[str, float] = {}
    for pid, (group, seconds) in after.items():
        if pid in before:
            totals[group] = totals.get(group, 0.0) + seconds - before[pid][1]
    totals[LOAD_GENERATOR] = ab_cpu_s
    return {group: round(1000 * seconds / max(1, requests), 2) for group, seconds in sorted(totals.items())}
