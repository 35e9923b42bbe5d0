"""A serving layout's records: what the plan (kit/plan.py) decides, and what a server reads back.

    layout = Layout.from_dict(json.loads(Path("logs/layout.json").read_text()))
    layout.models[name].workers[0]          # WorkerPlan(cpus=(4,), threads=1, numa_node=0)

A model's demand on the machine (Demand), each worker's CPUs (WorkerPlan), each model's workers
(ModelPlan), the memory the layout is expected to hold against its budget (MemoryPlan), and the
layout whole (Layout, as `logs/layout.json`). Kept apart from the decision that fills them, so
that what reads a layout (the launcher, the server, the kit's CLI) imports the records only.
"""

from __future__ import annotations

import dataclasses
import enum

from kit.footprint import Footprint
from kit.topology import gib

# The frontend's JVM: a heap of FRONTEND_HEAP_FRACTION of the budget within these bounds (it
# holds requests in flight: up to max_request_mb each), plus what the JVM holds beside its heap
# (code, metaspace, thread stacks: ~250 MB RSS measured idle with the serial collector).
FRONTEND_HEAP_FRACTION = 1 / 32
FRONTEND_HEAP_BOUNDS = (256 * 2**20, 2 * 2**30)
FRONTEND_NATIVE = 256 * 2**20
# Kept free: the page cache of archives being unpacked, the kit's own processes, bodies in flight.
HEADROOM_FRACTION = 0.10
MIN_HEADROOM = 256 * 2**20


class Allocator(enum.StrEnum):
    DEFAULT = "default"  # glibc malloc: nothing preloaded
    JEMALLOC = "jemalloc"
    TCMALLOC = "tcmalloc"


class OmpWaitPolicy(enum.StrEnum):
    """What a worker's OpenMP threads do between parallel regions (OMP_WAIT_POLICY)."""

    DEFAULT = "default"  # libgomp's own: spin a while, then sleep
    PASSIVE = "passive"  # sleep at once: frees the core for the frontend and other workers
    ACTIVE = "active"  # spin: lowest wake-up latency, burns the core


# What a preset preloads unless it says otherwise (kit/serve_config.py). Measured: ties glibc on
# ResNet-50, ahead of jemalloc (docs/benchmarks.md).
PREFERRED_ALLOCATOR = Allocator.TCMALLOC


class PlanError(ValueError):
    """The plan's inputs are wrong; the message says which and how to fix it."""


class Objective(enum.StrEnum):
    THROUGHPUT = "throughput"
    LATENCY = "latency"


@dataclasses.dataclass(frozen=True)
class Sequences:
    """A language model's KV cache: what each sequence a worker generates at once holds."""

    per_sequence: int  # a context's bytes: layers x 2 (keys, values) x kv heads x head size x context x dtype
    most: int  # its settings' max_sequences (or the preset's model_sequences), and as many contexts of KV at most


class Grouping(enum.StrEnum):
    """How a model's cores are made into workers."""

    OBJECTIVE = "objective"  # the objective's: a single-threaded worker per core, or one per L3 domain
    DOMAIN = "domain"  # one per L3 domain of its cores, whatever the objective (a language model's engine)
    ONE = "one"  # one over all its cores (a model TorchServe must give one worker)


# A worker whose cores span several NUMA nodes: its memory is interleaved over them (kit/pin_worker.py).
INTERLEAVED = -1


@dataclasses.dataclass(frozen=True)
class Demand:
    model: str
    share: float = 1.0  # relative traffic: a model with share 2 gets twice the cores of one with 1
    allocator: str = PREFERRED_ALLOCATOR.value  # preloaded into its workers (its backend's; OpenVINO: "default")
    footprint: Footprint | None = None  # one warmed worker's memory; None: never measured
    grouping: Grouping = Grouping.OBJECTIVE
    sequences: Sequences | None = None  # a language model's KV cache, sized by the memory plan
    omp_wait_policy: OmpWaitPolicy | None = None  # its workers' own; None: the preset's

    @classmethod
    def parse(cls, text: str) -> Demand:
        """ "NAME=2" or "NAME"."""
        name, _, share = text.partition("=")
        example = f"{name.strip() or 'NAME'}=2"  # the right spelling of what was given
        try:
            demand = cls(name.strip(), float(share) if share else 1.0)
        except ValueError:
            raise PlanError(f"model {text!r}: the traffic share after '=' must be a number, e.g. {example}") from None
        if not demand.model or not demand.share > 0:
            raise PlanError(f"model {text!r}: need a name and a share > 0, e.g. {example}")
        return demand


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    cpus: tuple[int, ...]  # logical CPU ids, as lscpu names them; one per core
    threads: int  # OpenMP threads: one per core
    numa_node: int  # memory bound here; INTERLEAVED: interleaved over the nodes of its cores

    def to_dict(self) -> dict:
        return {"cpus": list(self.cpus), "threads": self.threads, "numa_node": self.numa_node}


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    workers: tuple[WorkerPlan, ...]
    allocator: str = PREFERRED_ALLOCATOR.value
    sequences: int = 0  # a language model's: sequences each worker generates at once (0: not one)
    omp_wait_policy: str = ""  # an OmpWaitPolicy its workers get over the preset's; "": the preset's
    # A language model's KV cache, in whole contexts (its positions: these x context_length),
    # which its sequences share (handlers/generation/kv_budget.py): `sequences` unless the memory
    # holds fewer. 0: not a language model.
    kv_contexts: int = 0

    def to_dict(self) -> dict:
        return {
            "workers": [w.to_dict() for w in self.workers],
            "allocator": self.allocator,
            "sequences": self.sequences,
            "omp_wait_policy": self.omp_wait_policy,
            "kv_contexts": self.kv_contexts,
        }


def frontend_heap(budget: int) -> int:
    low, high = FRONTEND_HEAP_BOUNDS
    return min(max(int(budget * FRONTEND_HEAP_FRACTION), low), high)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes the layout is expected to hold, against its budget."""

    budget: int
    models: dict[str, int]  # each model's workers (Footprint.cost)
    frontend_heap: int  # the JVM's -Xmx
    note: str = ""  # how the layout was reduced to fit, if it was

    @property
    def frontend(self) -> int:
        return self.frontend_heap + FRONTEND_NATIVE

    @property
    def headroom(self) -> int:
        return max(MIN_HEADROOM, int(self.budget * HEADROOM_FRACTION))

    @property
    def total(self) -> int:
        """What the plan expects to hold, headroom included: never above the budget."""
        return sum(self.models.values()) + self.frontend + self.headroom

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    def to_dict(self) -> dict:
        return {
            "budget": self.budget,
            "total": self.total,
            "models": self.models,
            "frontend_heap": self.frontend_heap,
            "frontend": self.frontend,
            "headroom": self.headroom,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, raw: dict) -> MemoryPlan:
        return cls(raw["budget"], raw["models"], raw["frontend_heap"], raw["note"])

    def summary(self) -> str:
        models = ", ".join(f"{name} {gib(size)}" for name, size in self.models.items())
        return (
            f"memory: {gib(self.total)} of {gib(self.budget)} (workers: {models}; frontend {gib(self.frontend)} "
            f"with a {self.frontend_heap // 2**20} MiB heap; headroom {gib(self.headroom)})"
            + (f"; {self.note}" if self.note else "")
        )


@dataclasses.dataclass(frozen=True)
class Layout:
    objective: Objective
    models: dict[str, ModelPlan]
    frontend_cpus: tuple[int, ...]  # the Java frontend's CPUs (all usable ones when none are reserved)
    serving_cores: int  # cores the workers run on
    capacity: int  # cores the process may use (allowed, capped by the quota)
    memory: MemoryPlan | None = None  # None: not planned (`unplanned` says why)
    unplanned: str = ""

    @classmethod
    def from_dict(cls, raw: dict) -> Layout:
        models = {
            name: ModelPlan(
                tuple(WorkerPlan(tuple(w["cpus"]), w["threads"], w["numa_node"]) for w in model["workers"]),
                model["allocator"],
                model.get("sequences", 0),
                model.get("omp_wait_policy", ""),
                model.get("kv_contexts", model.get("sequences", 0)),
            )
            for name, model in raw["models"].items()
        }
        memory = raw.get("memory")
        return cls(
            Objective(raw["objective"]),
            models,
            tuple(raw["frontend_cpus"]),
            raw["serving_cores"],
            raw["capacity"],
            MemoryPlan.from_dict(memory) if memory else None,
            raw.get("unplanned", ""),
        )

    def to_dict(self) -> dict:
        return {
            "objective": self.objective.value,
            "capacity": self.capacity,
            "serving_cores": self.serving_cores,
            "frontend_cpus": list(self.frontend_cpus),
            "models": {name: model.to_dict() for name, model in self.models.items()},
            "memory": self.memory.to_dict() if self.memory else None,
            "unplanned": self.unplanned,
        }

    def summary(self) -> list[str]:
        from kit.topology import format_cpus

        lines = [
            f"{self.objective.value}: {self.serving_cores} serving core(s) of {self.capacity}; "
            f"frontend on CPUs {format_cpus(self.frontend_cpus)}"
        ]
        for name, model in self.models.items():
            threads = sorted({w.threads for w in model.workers})
            nodes = sorted({"interleaved" if w.numa_node == INTERLEAVED else str(w.numa_node) for w in model.workers})
            lines.append(
                f"{name}: {len(model.workers)} worker(s) x {'/'.join(map(str, threads))} thread(s) on CPUs "
                f"{format_cpus(c for w in model.workers for c in w.cpus)} (node {', '.join(nodes)}); "
                f"{model.allocator}"
                + (
                    f"; {model.sequences} sequence(s) at once per worker, sharing a KV cache of "
                    f"{model.kv_contexts} context(s)"
                    if model.sequences
                    else ""
                )
            )
        lines.append(self.memory.summary() if self.memory else f"memory: not planned ({self.unplanned})")
        return lines
