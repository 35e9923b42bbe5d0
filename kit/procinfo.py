"""What a running worker process really uses: allocator mapped, CPU affinity, memory.

    info = inspect_process(12345)   # ProcessInfo(allocator='jemalloc', cpus=(0, 1), rss_mb=812.4)

The allocator is read from /proc/PID/maps, not from configuration: a launcher that silently
failed to find the library shows up here as 'default'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from kit.topology import kb_fields

# Substring of the mapped file name -> allocator name.
ALLOCATOR_LIBRARIES = {"libjemalloc": "jemalloc", "libtcmalloc": "tcmalloc"}


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    pid: int
    allocator: str  # jemalloc | tcmalloc | default (glibc malloc)
    cpus: tuple[int, ...]
    rss_mb: float
    peak_rss_mb: float  # VmHWM: the most the process ever held, so a past spike still shows
    omp_threads: str  # OMP_NUM_THREADS in the process environment, "" if unset
    memory_policy: str  # NUMA memory policy of its first mapping: "bind:0" when bound to node 0, else "default"


def loaded_allocator(pid: int) -> str:
    maps = Path(f"/proc/{pid}/maps").read_text()
    for marker, name in ALLOCATOR_LIBRARIES.items():
        if marker in maps:
            return name
    return "default"


def process_environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def memory_mb(pid: int, field: str = "VmRSS") -> float:
    """A memory line of /proc/PID/status (VmRSS now, VmHWM peak) in MB (0 for a kernel thread)."""
    return kb_fields(Path(f"/proc/{pid}/status").read_text()).get(field, 0) / 2**20


def memory_policy(pid: int) -> str:
    """The policy field of /proc/PID/numa_maps' first line ("default", "bind:0", "interleave:0-1")."""
    try:
        with open(f"/proc/{pid}/numa_maps") as maps:
            first = maps.readline().split()
    except OSError:  # a kernel without NUMA support has no numa_maps
        return "n/a"
    return first[1] if len(first) > 1 else "n/a"


def inspect_process(pid: int) -> ProcessInfo:
    return ProcessInfo(
        pid=pid,
        allocator=loaded_allocator(pid),
        cpus=tuple(sorted(os.sched_getaffinity(pid))),
        rss_mb=memory_mb(pid),
        peak_rss_mb=memory_mb(pid, "VmHWM"),
        omp_threads=process_environment(pid).get("OMP_NUM_THREADS", ""),
        memory_policy=memory_policy(pid),
    )


def mapped_files(pid: int, under: Path) -> set[Path]:
    """Files below `under` that the process has mapped (e.g. compiled kernels it loaded)."""
    prefix = str(under.resolve()) + "/"
    paths = (line.split(maxsplit=5)[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines())
    return {Path(path) for path in paths if path.startswith(prefix)}


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); count it as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def process_tree(pid: int | None) -> list[psutil.Process]:
    """The process and all its descendants; [] when it is gone (or was never started)."""
    if pid is None:
        return []
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    return []


def live_process(pid: int | None) -> ProcessInfo | None:
    """What /proc says of a worker pid; None if it is gone (also if it dies while being read)."""
    if not pid or not process_alive(pid):
        return None
    try:
        return inspect_process(pid)
    except OSError:
        return None


def cpu_times(stat: str | None = None) -> dict[int, tuple[int, int]]:
    """Per CPU (busy, total) jiffies from /proc/stat."""
    text = stat if stat is not None else Path("/proc/stat").read_text()
    times = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            values = [int(v) for v in fields]
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            times[int(name[3:])] = (sum(values[:8]) - idle, sum(values[:8]))
    return times


def busy_fractions(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]) -> dict[int, float]:
    """Per CPU, the share of the interval between two cpu_times() it was busy."""
    fractions = {}
    for cpu, (busy, total) in after.items():
        busy0, total0 = before.get(cpu, (0, 0))
        fractions[cpu] = (busy - busy0) / (total - total0) if total > total0 else 0.0
    return fractions


def listening_ports(process: psutil.Process) -> set[int]:
    """TCP ports the process listens on now (from /proc)."""
    return {c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}


# How often a stop looks at what is left.
STOP_POLL_S = 0.05


def terminate(
    processes: list[psutil.Process], timeout_s: float, idle: Callable[[psutil.Process], bool] | None = None
) -> None:
    """SIGTERM, then SIGKILL at the deadline; returns when all have ended. With `idle`: once every
    process left is one it calls idle (done, only waiting to exit), those are killed at once."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    deadline = time.monotonic() + timeout_s
    alive = [p for p in processes if not ended(p)]
    while alive and time.monotonic() < deadline:
        if idle and all(_idle(idle, process) for process in alive):
            break
        time.sleep(STOP_POLL_S)
        alive = [p for p in alive if not ended(p)]
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    deadline = time.monotonic() + 10
    while (alive := [p for p in alive if not ended(p)]) and time.monotonic() < deadline:
        time.sleep(STOP_POLL_S)


def ended(process: psutil.Process) -> bool:
    """Gone or a zombie. A zombie has ended: one whose parent died first waits for init to reap it,
    which here took 1.5 s (a Firecracker VM's init) and under systemd takes none."""
    try:
        process.wait(0)  # reaps a child of ours, keeping its returncode
        return True
    except psutil.TimeoutExpired:
        pass
    except psutil.Error:
        return True
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:  # it ended between the two looks: a stop reaps it at any moment
        return True


def _idle(idle: Callable[[psutil.Process], bool], process: psutil.Process) -> bool:
    try:
        return idle(process)
    except psutil.Error:  # gone meanwhile
        return True
