"""The machine as this process may use it: allowed CPUs, CPU quota, cores, SMT siblings, NUMA
nodes, last-level-cache (L3) domains, the vector ISA and memory (the machine's, each NUMA node's,
the cgroup's limit).

    topology = read_topology()                                        # this process, this machine
    topology = parse_topology(lscpu_text, allowed={2, 3}, quota=1.5)  # injected: tests, `kit plan --lscpu`

`lscpu -p` describes the whole host, also inside a container: what a process may really use is
its affinity mask (`sched_getaffinity`, the container's cpuset) and its cgroup CPU quota
(`cpu.max`, or `cpu.cfs_quota_us` / `cpu.cfs_period_us` on cgroup v1), read here apart; so is
its memory limit (`memory.max`, v1 `memory.limit_in_bytes`), which /proc/meminfo does not show.
Never `os.cpu_count()`: it counts the host's CPUs.

One module, because the injected topology (tests, other machines) and this machine's must be
the same record built by the same parser; the part below "this machine" only reads /proc and /sys.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

from handlers.backends import ISAS, bf16_isa, cpu_isas
from handlers.backends import cpuinfo as read_cpuinfo
from kit.cgroup import CGROUP, cgroup_memory_limit, cgroup_quota

LSCPU_COLUMNS = "CPU,CORE,SOCKET,NODE,CACHE"


class TopologyError(ValueError):
    """The machine description cannot be read; the message says which input and why."""


@dataclasses.dataclass(frozen=True)
class Cpu:
    id: int  # the logical CPU id, as lscpu and taskset name it
    core: int
    socket: int
    node: int  # NUMA node (0 when the machine reports none)
    l3: int  # last-level-cache id: a domain of cores that share it (an AMD CCX, an Intel socket)


@dataclasses.dataclass(frozen=True)
class Core:
    """A physical core: its logical CPUs (SMT siblings); the kit pins to the first."""

    cpus: tuple[int, ...]
    socket: int
    node: int
    l3: int

    @property
    def cpu(self) -> int:
        return self.cpus[0]


@dataclasses.dataclass(frozen=True)
class Topology:
    cpus: tuple[Cpu, ...]  # the logical CPUs this process may run on
    quota: float | None = None  # cgroup CPU limit in CPUs (1.5 = 150 ms per 100 ms); None = none
    flags: frozenset[str] = frozenset()  # the /proc/cpuinfo flags of its ISAS
    model_name: str = ""
    memory: Memory | None = None  # None: not read (an injected topology)

    @property
    def cores(self) -> tuple[Core, ...]:
        """Physical cores with at least one allowed CPU, in (node, L3, core) order."""
        groups: dict[tuple[int, int], list[Cpu]] = {}
        for cpu in self.cpus:
            groups.setdefault((cpu.socket, cpu.core), []).append(cpu)
        cores = [
            Core(tuple(sorted(c.id for c in cpus)), cpus[0].socket, cpus[0].node, cpus[0].l3)
            for cpus in groups.values()
        ]
        return tuple(sorted(cores, key=lambda core: (core.node, core.l3, core.cpu)))

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted({cpu.node for cpu in self.cpus}))

    @property
    def l3_domains(self) -> tuple[int, ...]:
        return tuple(sorted({cpu.l3 for cpu in self.cpus}))

    @property
    def sockets(self) -> tuple[int, ...]:
        return tuple(sorted({cpu.socket for cpu in self.cpus}))

    @property
    def capacity(self) -> int:
        """Whole cores' worth of CPU time the process may use: cores, capped by the quota."""
        cores = len(self.cores)
        if self.quota is None:
            return cores
        return max(1, min(cores, math.floor(self.quota + 1e-9)))

    def restricted(self, cpus: set[int]) -> Topology:
        """The same machine narrowed to `cpus` (a subset of the allowed ones), as a cpuset would."""
        outside = cpus - {cpu.id for cpu in self.cpus}
        if outside:
            raise TopologyError(
                f"CPUs {format_cpus(outside)} are not among the usable ones ({format_cpus(c.id for c in self.cpus)})"
            )
        return dataclasses.replace(self, cpus=tuple(cpu for cpu in self.cpus if cpu.id in cpus))

    @property
    def bf16_summary(self) -> str:
        if not self.flags:  # a machine described by its lscpu alone
            return "unknown"
        return bf16_isa(self.flags) or "not computed here (bf16 variants are refused)"

    def summary(self) -> list[str]:
        """A few human lines: what `python -m kit topology` prints."""
        cores = self.cores
        smt = max((len(core.cpus) for core in cores), default=1)
        quota = "no CPU quota" if self.quota is None else f"CPU quota {self.quota:g} CPUs"
        return [
            f"CPU: {self.model_name or 'unknown'}; ISA: {' '.join(cpu_isas(self.flags)) or 'none known'}"
            f"; bf16: {self.bf16_summary}",
            f"usable: {len(self.cpus)} logical CPUs ({format_cpus(c.id for c in self.cpus)}) on {len(cores)} physical "
            f"cores, {smt} thread(s) per core; {quota}: {self.capacity} core(s) of capacity",
            f"{len(self.sockets)} socket(s), {len(self.nodes)} NUMA node(s), {len(self.l3_domains)} L3 domain(s): "
            + "; ".join(self._node_summary(node, cores) for node in self.nodes),
            *([self.memory.summary()] if self.memory else []),
        ]

    @staticmethod
    def _node_summary(node: int, cores: tuple[Core, ...]) -> str:
        mine = [c for c in cores if c.node == node]
        sizes = sorted({sum(1 for c in mine if c.l3 == l3) for l3 in {c.l3 for c in mine}})
        domains = len({c.l3 for c in mine})
        return (
            f"node {node}: cores on CPUs {format_cpus(c.cpu for c in mine)}, {domains} L3 domain(s) of "
            f"{'/'.join(map(str, sizes))} core(s)"
        )

    def to_dict(self) -> dict:
        return {
            "model_name": self.model_name,
            "flags": sorted(self.flags),
            "quota": self.quota,
            "capacity": self.capacity,
            "cpus": [dataclasses.asdict(cpu) for cpu in self.cpus],
            "cores": [list(core.cpus) for core in self.cores],
            "nodes": list(self.nodes),
            "l3_domains": list(self.l3_domains),
            "memory": dataclasses.asdict(self.memory) if self.memory else None,
        }


def format_cpus(ids: Iterable[int]) -> str:
    """0,1,2,3,8 -> "0-3,8" (taskset's list syntax)."""
    ordered = sorted(set(ids))
    runs: list[list[int]] = []
    for cpu in ordered:
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def parse_cpus(text: str) -> set[int]:
    """ "0-3,8" -> {0, 1, 2, 3, 8}; the inverse of format_cpus."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        try:
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
        except ValueError:
            raise TopologyError(f"CPU list {text!r} is not like 0-3,8") from None
    return cpus


def _field(fields: list[str], header: list[str], name: str) -> str:
    index = header.index(name) if name in header else len(fields)
    return fields[index].strip() if index < len(fields) else ""


def _number(text: str) -> int:
    return int(text) if text.isdigit() else 0  # a machine without NUMA or cache ids reports ""


def parse_lscpu(text: str) -> list[Cpu]:
    """`lscpu -p=CPU,CORE,SOCKET,NODE,CACHE` output. Its cache field is "L1d:L1i:L2:L3" in most
    versions and separate L1d,L1i,L2,L3 columns in others: the header line says which."""
    header: list[str] = []
    cpus = []
    for line in text.splitlines():
        if line.startswith(("# CPU,", "#CPU,")):
            header = [name.strip().upper() for name in line.lstrip("# ").split(",")]
        if not line.strip() or line.startswith("#"):
            continue
        if not header:
            raise TopologyError(
                f"no '# CPU,Core,Socket,Node,...' header before the data; run `lscpu -p={LSCPU_COLUMNS}`"
            )
        fields = line.split(",")
        if "L3" in header:
            l3 = _number(_field(fields, header, "L3"))
        else:  # one field "L1d:L1i:L2:L3"
            l3 = _number(_field(fields, header, "CACHE").split(":")[-1])
        cpu = _field(fields, header, "CPU")
        if not cpu.isdigit():
            raise TopologyError(f"lscpu line {line!r} has no CPU number")
        core, socket, node = (_number(_field(fields, header, name)) for name in ("CORE", "SOCKET", "NODE"))
        cpus.append(Cpu(int(cpu), core, socket, node, l3))
    if not cpus:
        raise TopologyError("lscpu output has no CPU lines")
    return cpus


def parse_topology(
    lscpu_text: str,
    allowed: set[int] | None = None,
    quota: float | None = None,
    flags: Iterable[str] = (),
    model_name: str = "",
) -> Topology:
    cpus = parse_lscpu(lscpu_text)
    if allowed is not None:
        unknown = sorted(allowed - {c.id for c in cpus})
        if unknown:
            raise TopologyError(f"allowed CPUs {format_cpus(unknown)} are not in the lscpu description")
        cpus = [c for c in cpus if c.id in allowed]
    if quota is not None and not quota > 0:
        raise TopologyError(f"quota must be > 0 CPUs, got {quota}")
    return Topology(tuple(cpus), quota, frozenset(flags) & frozenset().union(*ISAS.values()), model_name)


# -- this machine ---------------------------------------------------------------------------
def cpuinfo() -> tuple[str, frozenset[str]]:
    """The CPU's model name and flags from /proc/cpuinfo."""
    fields = read_cpuinfo()
    return fields.get("model name", ""), frozenset(fields.get("flags", "").split())


def kb_fields(text: str) -> dict[str, int]:
    """The "Key: N kB" lines of a /proc file in bytes, by key: meminfo (a NUMA node's too, whose
    keys start "Node 0 "), PID/status, PID/smaps_rollup."""
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        parts = value.split()
        if name.strip() and len(parts) == 2 and parts[1] == "kB":
            fields[name.split()[-1]] = int(parts[0]) * 1024
    return fields


def meminfo_bytes(text: str, key: str) -> int:
    if (size := kb_fields(text).get(key)) is None:
        raise TopologyError(f"no {key} in meminfo")
    return size


@dataclasses.dataclass(frozen=True)
class Memory:
    """The memory this process may use: the machine's, its NUMA nodes', and its cgroup's limit."""

    total: int  # bytes: the machine's MemTotal
    available: int  # MemAvailable when read: what can be allocated without swapping
    limit: int | None = None  # the cgroup's limit (a container's, a pod's); None = none
    nodes: tuple[tuple[int, int, int], ...] = ()  # (node, MemTotal, MemFree) per NUMA node

    @property
    def budget(self) -> int:
        """What the kit's processes may hold at most: the cgroup limit, else the machine's total."""
        return self.total if self.limit is None else min(self.limit, self.total)

    def summary(self) -> str:
        limit = "no memory limit" if self.limit is None else f"cgroup memory limit {gib(self.limit)}"
        nodes = "".join(
            f"; node {n}: {gib(total)}, {gib(free)} free" for n, total, free in self.nodes if len(self.nodes) > 1
        )
        return f"memory: {gib(self.total)}, {gib(self.available)} available; {limit}{nodes}"


def gib(size: int) -> str:
    """ "1.3 GiB"; below a GiB "612 MiB"."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


# Kubernetes' quantity suffixes (what a pod's `memory:` says), and GiB/MiB spelled out.
SIZE_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}


def parse_size(text: str) -> int:
    """ "8Gi", "6GiB", "512Mi", "2G", "1073741824" -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*?)(?:[bB])?\s*", text)
    unit = match and match.group(2).lower()
    if not match or unit not in SIZE_UNITS:
        raise TopologyError(f"memory size {text!r} is not a size: give e.g. 8Gi, 6GiB, 512Mi or bytes")
    return int(float(match.group(1)) * SIZE_UNITS[unit])


def read_memory(
    proc_cgroup: str | None = None, root: Path = CGROUP, sys_nodes: Path = Path("/sys/devices/system/node")
) -> Memory:
    text = Path("/proc/meminfo").read_text()
    nodes = []
    for directory in sorted(sys_nodes.glob("node[0-9]*"), key=lambda d: int(d.name[4:])):
        info = (directory / "meminfo").read_text()
        nodes.append((int(directory.name[4:]), meminfo_bytes(info, "MemTotal"), meminfo_bytes(info, "MemFree")))
    return Memory(
        meminfo_bytes(text, "MemTotal"),
        meminfo_bytes(text, "MemAvailable"),
        cgroup_memory_limit(proc_cgroup, root),
        tuple(nodes),
    )


def read_topology() -> Topology:
    """This process's view: lscpu for the shape, affinity and cgroup for what it may use."""
    completed = subprocess.run(["lscpu", f"-p={LSCPU_COLUMNS}"], capture_output=True, text=True)
    if completed.returncode != 0:
        raise TopologyError(f"`lscpu -p={LSCPU_COLUMNS}` failed: {completed.stderr.strip()}; install util-linux")
    name, flags = cpuinfo()
    topology = parse_topology(completed.stdout, os.sched_getaffinity(0), cgroup_quota(), flags, name)
    return dataclasses.replace(topology, memory=read_memory())
