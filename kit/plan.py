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
  two NUMA nodes or L3 domains (but the single worker below); its memory is bound to its node.
- Models: the cores are split in proportion to traffic shares; a model gets at least
  MIN_CORES_PER_MODEL cores (all of them on a small machine), so models overlap, and then share
  cores, only where the machine has too few for each to have its own.
- A model whose worker batches its own requests (a language model's engine: every stream in one
  forward per step) gets one worker per L3 domain of its cores, those cores as its threads,
  whatever the objective: single-threaded workers would split the streams and read the weights
  once per core instead of once per domain. One that TorchServe must give a single worker (a
  language model on continuousBatching) gets one over all its cores, its memory interleaved
  over their nodes.
- Memory: every worker is a process with its own copy of the runtime and the weights. With each
  model's measured footprint (kit/footprint.py) and a budget (the cgroup's limit, else the
  machine's memory; `memory:` of a preset, `--memory`), the workers, the frontend (its JVM heap is
  set from the budget) and a headroom must fit. When they would not, a worker gets more cores
  (2, 4, ... up to an L3 domain: fewer workers, the cores stay busy); then a language model's KV
  cache holds fewer contexts (its sequences share them); then workers are dropped,
  the costliest model's first; when even one worker per model does not fit, the plan is refused
  naming each model's footprint and the budget. Without a footprint the memory is not planned,
  and the plan says so.

One module, because cores, workers and memory are one decision: a worker that does not fit
the memory gets more cores, which changes the layout the memory plan is made from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from kit.footprint import Footprint
from kit.layout import (
    INTERLEAVED,
    Demand,
    Grouping,
    Layout,
    MemoryPlan,
    ModelPlan,
    Objective,
    PlanError,
    WorkerPlan,
    frontend_heap,
)
from kit.topology import Core, Topology, gib

FRONTEND_FRACTION = 0.125
MIN_CORES_TO_RESERVE = 8
MIN_CORES_PER_MODEL = 4


GROUPINGS = {
    Grouping.OBJECTIVE: lambda groups: groups,
    Grouping.DOMAIN: lambda groups: [tuple(domain) for domain in l3_domains([c for group in groups for c in group])],
    Grouping.ONE: lambda groups: [tuple(c for group in groups for c in group)],
}


def worker(cores: Sequence[Core]) -> WorkerPlan:
    """A worker on `cores`, a thread each, its memory on their node (or interleaved over theirs)."""
    nodes = {core.node for core in cores}
    return WorkerPlan(tuple(core.cpu for core in cores), len(cores), nodes.pop() if len(nodes) == 1 else INTERLEAVED)


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
    """`threads` fixes the cores per worker (what `make tune` searches); None leaves it to the
    objective, and to the memory budget."""
    layout = place(topology, demands, objective, threads)
    unmeasured = [d.model for d in demands if d.footprint is None]
    if topology.memory is None:
        return dataclasses.replace(layout, unplanned="no memory budget given")
    if unmeasured:
        why = f"no footprint measured yet for {', '.join(unmeasured)}: `make serve` records it once READY"
        if topology.memory.limit is None:
            return dataclasses.replace(layout, unplanned=why)
        return cautious(topology, demands, objective, threads, unmeasured, why)
    # A language model's footprint as it would be with its settings' number of sequences.
    footprints = {
        d.model: d.footprint.with_sequences(d.sequences.most, d.sequences.per_sequence) if d.sequences else d.footprint
        for d in demands
    }
    budget = topology.memory.budget
    wider = widen(layout, topology, demands, objective, [] if threads else thread_counts(topology), footprints)
    sized = smaller_kv_caches(wider, demands, footprints, budget)
    fitted, dropped = drop_workers(sized, footprints, budget, kv_caches(demands))
    plan = memory_plan(fitted, footprints, budget)
    if fitted != layout:
        idle = f" ({dropped} worker(s) dropped: their cores idle)" if dropped else ""
        plan = dataclasses.replace(plan, note=f"reduced to fit: {shape(layout)} -> {shape(fitted)}{idle}")
    return dataclasses.replace(fitted, memory=plan)


def smaller_kv_caches(
    layout: Layout, demands: Sequence[Demand], footprints: dict[str, Footprint], budget: int
) -> Layout:
    """`layout` with its language models' KV caches holding fewer contexts, in the demands' order,
    until it fits (at least one each); `footprints` updated to match. A context fewer costs a
    worker a context's KV cache, not the cores and weights a dropped worker would; its sequences
    still generate at once, sharing the positions that are left (handlers/generation/kv_budget.py)."""
    for demand in demands:
        plan = memory_plan(layout, footprints, budget)
        if plan.fits:
            break
        if not demand.sequences:
            continue
        model = layout.models[demand.model]
        per_worker = len(model.workers) * demand.sequences.per_sequence
        contexts = max(1, model.kv_contexts - math.ceil((plan.total - budget) / per_worker))
        footprints[demand.model] = footprints[demand.model].with_sequences(contexts, demand.sequences.per_sequence)
        layout = dataclasses.replace(
            layout, models={**layout.models, demand.model: dataclasses.replace(model, kv_contexts=contexts)}
        )
    return layout


def kv_caches(demands: Sequence[Demand]) -> dict[str, str]:
    """What a refusal says of each language model's KV cache."""
    return {
        d.model: f" (with a KV cache of 1 context: {gib(d.sequences.per_sequence)})" for d in demands if d.sequences
    }


def cautious(
    topology: Topology,
    demands: Sequence[Demand],
    objective: Objective,
    threads: int | None,
    unmeasured: Sequence[str],
    why: str,
) -> Layout:
    """Under a memory limit, a model never measured starts one worker as wide as a worker gets:
    a full layout of unknown size is what a pod is OOM-killed for while warming up, in a loop.
    READY records its footprint; the next start plans it."""
    widest = threads or max(thread_counts(topology), default=1)
    layout = place(topology, demands, objective, widest)
    models = {
        name: dataclasses.replace(model, workers=model.workers[:1]) if name in unmeasured else model
        for name, model in layout.models.items()
    }
    return dataclasses.replace(layout, models=models, unplanned=f"{why}; until then one worker each under the limit")


def widen(
    layout: Layout,
    topology: Topology,
    demands: Sequence[Demand],
    objective: Objective,
    thread_choices: Sequence[int],
    footprints: dict[str, Footprint],
) -> Layout:
    """`layout`, or the first with more cores per worker (fewer workers, every core busy) that fits."""
    budget = topology.memory.budget
    for threads in thread_choices:
        if memory_plan(layout, footprints, budget).fits:
            break
        layout = place(topology, demands, objective, threads)
    return layout


def drop_workers(
    layout: Layout, footprints: dict[str, Footprint], budget: int, details: dict[str, str] | None = None
) -> tuple[Layout, int]:
    """Workers taken away, the costliest model's first, until the layout fits; PlanError when one
    worker per model does not (naming each model's footprint, with its `details`)."""
    models = dict(layout.models)
    dropped = 0
    while not (plan := memory_plan(layout, footprints, budget)).fits:
        several = [name for name in models if len(models[name].workers) > 1]
        if not several:
            needs = ", ".join(f"{name} {footprints[name].summary()}{(details or {}).get(name, '')}" for name in models)
            raise PlanError(
                f"one worker per model needs {gib(plan.total)} (frontend and headroom included), more than the "
                f"memory budget of {gib(budget)}: {needs}. Serve fewer models per server, smaller variants "
                "(openvino-int8 holds about half of inductor's), or give the server more memory"
            )
        costliest = max(several, key=lambda name: footprints[name].per_worker)
        models[costliest] = dataclasses.replace(models[costliest], workers=models[costliest].workers[:-1])
        layout = dataclasses.replace(layout, models=dict(models))
        dropped += 1
    return layout, dropped


def shape(layout: Layout) -> str:
    """ "bert 2x1, lm 1x2 (KV 8 contexts)": workers x threads per model, a language model's KV cache."""
    return ", ".join(
        f"{name} {len(model.workers)}x{max(w.threads for w in model.workers)}"
        + (f" (KV {model.kv_contexts} contexts)" if model.sequences else "")
        for name, model in layout.models.items()
    )


def memory_plan(layout: Layout, footprints: dict[str, Footprint], budget: int) -> MemoryPlan:
    costs = {name: footprints[name].cost(len(model.workers)) for name, model in layout.models.items()}
    return MemoryPlan(budget, costs, frontend_heap(budget))


def place(topology: Topology, demands: Sequence[Demand], objective: Objective, threads: int | None) -> Layout:
    """The cores of every worker, memory aside."""
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
            tuple(worker(group) for group in GROUPINGS[demand.grouping](chosen)),
            demand.allocator,
            demand.sequences.most if demand.sequences else 0,
            demand.omp_wait_policy.value if demand.omp_wait_policy else "",
            demand.sequences.most if demand.sequences else 0,
        )
        offset += count
    return Layout(objective, models, frontend_cpus, len(serving), capacity)
