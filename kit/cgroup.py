"""This process's cgroup limits, read from /sys/fs/cgroup (v2 or v1): what a container or a pod
may use, which the machine's own numbers do not say.

    cgroup_quota()          # 1.5: 150 ms of CPU per 100 ms; None: no CPU limit
    cgroup_memory_limit()   # bytes the kernel OOM-kills at; None: no limit
    oom_kills()             # processes the OOM killer has killed in this cgroup

Each takes `proc_cgroup` (the text of /proc/self/cgroup) and `root` for tests.
"""

from __future__ import annotations

from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def _cgroup_dirs(proc_cgroup: str | None, root: Path, controller: str) -> list[tuple[bool, Path]]:
    """(cgroup v2?, directory) of this process's cgroup and each ancestor, for one controller.

    Inside a container the cgroup path may be "/" with the container's own cgroup mounted at the
    root: the walk up reaches the root, so both places are read."""
    text = proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text()
    dirs = []
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy, every controller
            dirs += [(True, directory) for directory in _ancestors(root, path)]
        elif controller in controllers.split(","):
            # v1: the hierarchy is mounted under its controllers' names, in either order.
            names = (controllers, ",".join(reversed(controllers.split(","))), controller)
            mount = next((root / name for name in names if (root / name).is_dir()), None)
            if mount:
                dirs += [(False, directory) for directory in _ancestors(mount, path)]
    return dirs


def cgroup_quota(proc_cgroup: str | None = None, root: Path = CGROUP) -> float | None:
    """The tightest CPU limit on this process's cgroup and its ancestors, in CPUs; None if none.

    cgroup v2: `cpu.max` is "QUOTA PERIOD" or "max PERIOD". v1: `cpu.cfs_quota_us` (-1 = none)
    over `cpu.cfs_period_us`.
    """
    limits = []
    for v2, directory in _cgroup_dirs(proc_cgroup, root, "cpu"):
        if v2 and (directory / "cpu.max").is_file():
            quota, _, period = (directory / "cpu.max").read_text().split()[:2] + [""]
            if quota != "max":
                limits.append(int(quota) / int(period or 100000))
        elif not v2 and (directory / "cpu.cfs_quota_us").is_file() and (directory / "cpu.cfs_period_us").is_file():
            quota = int((directory / "cpu.cfs_quota_us").read_text())
            if quota > 0:
                limits.append(quota / int((directory / "cpu.cfs_period_us").read_text()))
    return min(limits) if limits else None


# cgroup v1 says "no limit" with the largest page-aligned 63-bit number; anything this large is none.
V1_UNLIMITED = 1 << 60


def cgroup_memory_limit(proc_cgroup: str | None = None, root: Path = CGROUP) -> int | None:
    """The tightest memory limit on this process's cgroup and its ancestors, in bytes; None if none.

    What the kernel OOM-kills at: v2 `memory.max` ("max" = none), v1 `memory.limit_in_bytes`.
    A Kubernetes container's `resources.limits.memory` is its memory.max."""
    limits = []
    for v2, directory in _cgroup_dirs(proc_cgroup, root, "memory"):
        path = directory / ("memory.max" if v2 else "memory.limit_in_bytes")
        if path.is_file() and (text := path.read_text().strip()) != "max" and int(text) < V1_UNLIMITED:
            limits.append(int(text))
    return min(limits) if limits else None


def oom_kills(proc_cgroup: str | None = None, root: Path = CGROUP) -> int | None:
    """Processes the kernel's OOM killer has killed in this process's memory cgroup (and the
    cgroups under it) since the cgroup was made; None where the kernel does not say.

    v2: `oom_kill` of `memory.events`; v1: of `memory.oom_control` (kernel 4.13 and later). The
    nearest cgroup the mount shows (a container's own, mounted at the root): an ancestor's count
    holds its other children's kills too."""
    for v2, directory in _cgroup_dirs(proc_cgroup, root, "memory"):
        path = directory / ("memory.events" if v2 else "memory.oom_control")
        if path.is_file():
            fields = dict(line.split(maxsplit=1) for line in path.read_text().splitlines() if " " in line)
            return int(fields["oom_kill"]) if "oom_kill" in fields else None
    return None


def _ancestors(mount: Path, path: str) -> list[Path]:
    parts = [p for p in path.strip("/").split("/") if p]
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
