"""A serving layout planned from the machine: the exact CPUs of every worker of every model.

    layout = plan_layout(read_topology(), [Demand("resnet50"), Demand("bert", share=2)])
    layout.models["bert"].workers[0]        # WorkerPlan(cpus=(4,), threads=1, numa_node=0)
    .venv/bin/python -m kit plan --lscpu xeon.txt --models resnet50,bert=2 --json

A pure function of the topology, the models (with their traffic shares) and the objective:
- Cores: the allowed physical cores, one logical CPU each (SMT siblings are not extra OpenMP
  threads: they share the core's vector units); no more cores than the CPU quota pays for
  (floor: a throttled worker stalls every request it holds).
- Frontend: from 8 cores up, FRONTEND_FRACTION of them is reserved for TorchServe's Java
  frontend, which costs ~4-6 ms of CPU per request (measured); below that a reserved core
  would cost more than the frontend's share, so it shares the cores with the workers.
- Workers: `throughput` runs one single-threaded worker per core (no OpenMP barriers, so a
  worker never waits for a core the frontend holds: 2 x 1 beat 1 x 2 by 25-50 % in `make bench`);
  `latency` runs one worker per L3 domain, its cores as threads. A worker's cores never span
  two NUMA nodes or L3 domains; its memory is bound to its node.
- Models: the cores are split in proportion to traffic shares; a model gets at least
  MIN_CORES_PER_MODEL cores (all of them on a small machine), so models overlap, and then share
  cores, only where the machine has too few for each to have its own.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

from kit.topology import Core, Topology

FRONTEND_FRACTION = 0.125
MIN_CORES_TO_RESERVE = 8
MIN_CORES_PER_MODEL = 4


class Allocator(enum.StrEnum):
    DEFAULT = "default"  # glibc malloc: nothing preloaded
    JEMALLOC = "jemalloc"
    TCMALLOC = "tcmalloc"


# What a preset preloads unless it says otherwise (kit/serve_config.py). Measured: ties glibc on
# ResNet-50, ahead of jemalloc (docs/benchmarks.md).
PREFERRED_ALLOCATOR = Allocator.TCMALLOC


class PlanError(ValueError):
    """The plan's inputs are wrong; the message says which and how to fix it."""


class Objective(enum.StrEnum):
    THROUGHPUT = "throughput"
    LATENCY = "latency"


@dataclasses.dataclass(frozen=True)
class Demand:
    model: str
    share: float = 1.0  # relative traffic: bert=2 gets twice resnet50's cores
    allocator: str = PREFERRED_ALLOCATOR.value  # preloaded into its workers (its backend's; OpenVINO: "default")

    @classmethod
    def parse(cls, text: str) -> Demand:
        """ "bert=2" or "bert"."""
        name, _, share = text.partition("=")
        try:
            demand = cls(name.strip(), float(share) if share else 1.0)
        except ValueError:
            raise PlanError(f"model {text!r}: the traffic share after '=' must be a number, e.g. bert=2") from None
        if not demand.model or not demand.share > 0:
            raise PlanError(f"model {text!r}: need a name and a share > 0, e.g. bert=2")
        return demand


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    cpus: tuple[int, ...]  # logical CPU ids, as lscpu names them; one per core
    threads: int  # OpenMP threads: one per core
    numa_node: int  # memory bound here

    def to_dict(self) -> dict:
        return {"cpus": list(self.cpus), "threads": self.threads, "numa_node": self.numa_node}


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    workers: tuple[WorkerPlan, ...]
    allocator: str = PREFERRED_ALLOCATOR.value
    batch_size: int = 1

    def to_dict(self) -> dict:
        return {
            "workers": [w.to_dict() for w in self.workers],
            "allocator": self.allocator,
            "batch_size": self.batch_size,
        }


@dataclasses.dataclass(frozen=True)
class Layout:
    objective: Objective
    models: dict[str, ModelPlan]
    frontend_cpus: tuple[int, ...]  # the Java frontend's CPUs (all usable ones when none are reserved)
    serving_cores: int  # cores the workers run on
    capacity: int  # cores the process may use (allowed, capped by the quota)

    @classmethod
    def from_dict(cls, raw: dict) -> Layout:
        models = {
            name: ModelPlan(
                tuple(WorkerPlan(tuple(w["cpus"]), w["threads"], w["numa_node"]) for w in model["workers"]),
                model["allocator"],
                model["batch_size"],
            )
            for name, model in raw["models"].items()
        }
        return cls(
            Objective(raw["objective"]), models, tuple(raw["frontend_cpus"]), raw["serving_cores"], raw["capacity"]
        )

    def to_dict(self) -> dict:
        return {
            "objective": self.objective.value,
            "capacity": self.capacity,
            "serving_cores": self.serving_cores,
            "frontend_cpus": list(self.frontend_cpus),
            "models": {name: model.to_dict() for name, model in self.models.items()},
        }

    def summary(self) -> list[str]:
        from kit.topology import format_cpus

        lines = [
            f"{self.objective.value}: {self.serving_cores} serving core(s) of {self.capacity}; "
            f"frontend on CPUs {format_cpus(self.frontend_cpus)}"
        ]
        for name, model in self.models.items():
            threads = sorted({w.threads for w in model.workers})
            nodes = sorted({w.numa_node for w in model.workers})
            lines.append(
                f"{name}: {len(model.workers)} worker(s) x {'/'.join(map(str, threads))} thread(s) on CPUs "
                f"{format_cpus(c for w in model.workers for c in w.cpus)} (node {', '.join(map(str, nodes))}); "
                f"{model.allocator}"
            )
        return lines


def usable_cores(topology: Topology) -> list[Core]:
    """The cores the plan may use: compact (node by node, L3 by L3), no more than the quota pays for."""
    return list(topology.cores)[: topology.capacity]


def l3_domains(cores: Sequence[Core]) -> list[list[Core]]:
    """`cores` grouped by NUMA node and L3 domain: a worker never spans two."""
    domains: dict[tuple[int, int], list[Core]] = {}
    for core in cores:
        domains.setdefault((core.node, core.l3), []).append(core)
    return list(domains.values())


def thread_counts(topology: Topology) -> list[int]:
    """Cores per worker worth trying beyond one: 2, 4, ... up to the largest L3 domain of the
    usable cores, that domain's size last (6-core CCX: [2, 4, 6])."""
    largest = max(map(len, l3_domains(usable_cores(topology))))
    return [2**i for i in range(1, largest.bit_length()) if 2**i < largest] + ([largest] if largest > 1 else [])


def split(total: int, shares: Sequence[float]) -> list[int]:
    """`total` in proportion to `shares` by largest remainder, each at least 1."""
    exact = [total * share / sum(shares) for share in shares]
    counts = [math.floor(x) for x in exact]
    for index in sorted(range(len(shares)), key=lambda i: exact[i] - counts[i], reverse=True)[: total - sum(counts)]:
        counts[index] += 1
    return [max(1, count) for count in counts]


def worker_groups(
    cores: Sequence[Core], objective: Objective, models: int, threads: int | None = None
) -> list[tuple[Core, ...]]:
    """The cores of each worker slot (`threads` of them, or the objective's choice), never across
    a NUMA node or an L3 domain."""
    domains = l3_domains(cores)
    groups = []
    for domain in domains:
        if threads is not None:
            size = min(threads, len(domain))
        elif objective is Objective.THROUGHPUT:
            size = 1
        else:  # one worker per domain; with more models than domains, split so models do not share cores
            size = math.ceil(len(domain) / min(math.ceil(models / len(domains)), len(domain)))
        groups += [tuple(domain[i : i + size]) for i in range(0, len(domain), size)]
    return groups


def plan_layout(
    topology: Topology,
    demands: Sequence[Demand],
    objective: Objective = Objective.THROUGHPUT,
    threads: int | None = None,
) -> Layout:
    """`threads` fixes the cores per worker (what `make tune` searches); None leaves it to the objective."""
    if not demands:
        raise PlanError("no models to plan for")
    names = [d.model for d in demands]
    if len(set(names)) != len(names):
        raise PlanError(f"a model is named twice in {names}")
    capacity = topology.capacity
    usable = usable_cores(topology)
    reserve = round(capacity * FRONTEND_FRACTION) if capacity >= MIN_CORES_TO_RESERVE else 0
    serving, frontend = usable[: len(usable) - reserve], usable[len(usable) - reserve :]
    frontend_cpus = tuple(cpu for core in (frontend or usable) for cpu in core.cpus)

    slots = worker_groups(serving, objective, len(demands), threads)
    counts = split(len(slots), [d.share for d in demands])
    cores_per_slot = len(serving) / len(slots)
    minimum = min(len(slots), math.ceil(MIN_CORES_PER_MODEL / cores_per_slot))
    models = {}
    offset = 0
    for demand, count in zip(demands, counts, strict=True):
        # Partition offsets; a model below the minimum spans further and overlaps the next.
        span = max(count, minimum)
        chosen = [slots[(offset + i) % len(slots)] for i in range(span)]
        models[demand.model] = ModelPlan(
            tuple(WorkerPlan(tuple(core.cpu for core in group), len(group), group[0].node) for group in chosen),
            demand.allocator,
        )
        offset += count
    return Layout(objective, models, frontend_cpus, len(serving), capacity)
