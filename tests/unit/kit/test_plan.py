"""kit/plan.py: the layout planner on machine classes users serve from (tests/machines.py)."""

from __future__ import annotations

import itertools

import pytest

from kit.layout import INTERLEAVED, Demand, Grouping, Objective, PlanError
from kit.plan import FRONTEND_FRACTION, MIN_CORES_TO_RESERVE, plan_layout, thread_counts
from kit.topology import TopologyError, parse_cpus
from tests.machines import MACHINES, machine

MODELS = [Demand("resnet50"), Demand("bert"), Demand("minilm")]


@pytest.mark.parametrize("name", list(MACHINES))
@pytest.mark.parametrize("objective", list(Objective))
def test_layout_invariants(name, objective):
    topology = MACHINES[name]
    layout = plan_layout(topology, MODELS, objective)
    cores = {core.cpu: core for core in topology.cores}
    allowed = {cpu.id for cpu in topology.cpus}
    workers = [w for model in layout.models.values() for w in model.workers]
    worker_cpus = [cpu for w in workers for cpu in w.cpus]

    # Nothing pinned outside the allowed set; the frontend neither.
    assert set(worker_cpus) <= allowed and set(layout.frontend_cpus) <= allowed
    # One logical CPU per core: SMT siblings are not extra threads, threads = pinned cores.
    assert all(cpu in cores for cpu in worker_cpus)
    assert all(w.threads == len(w.cpus) for w in workers)
    # No worker spans two NUMA nodes or two L3 domains; memory is bound to its node.
    for w in workers:
        assert len({(cores[c].node, cores[c].l3) for c in w.cpus}) == 1, w
        assert w.numa_node == cores[w.cpus[0]].node
    # Every core within the capacity serves some model, except those reserved for the frontend.
    used = set(worker_cpus)
    assert len(used) == layout.serving_cores
    reserved = layout.capacity - layout.serving_cores
    assert reserved == (0 if layout.capacity < MIN_CORES_TO_RESERVE else round(layout.capacity * FRONTEND_FRACTION))
    if reserved:
        assert not used & set(layout.frontend_cpus)
    # Never more cores busy than the CPU quota pays for.
    assert len(used) + reserved <= topology.capacity <= (topology.quota or float("inf"))
    # No two workers share a core unless there are more workers than cores.
    if len(workers) <= layout.serving_cores:
        assert len(worker_cpus) == len(set(worker_cpus))
    # Every model is served.
    assert set(layout.models) == {d.model for d in MODELS} and all(m.workers for m in layout.models.values())


def test_this_vm_reproduces_the_measured_layout():
    # 2 workers x 1 thread per model, one per core, tcmalloc: what `make bench` measured best here.
    layout = plan_layout(MACHINES["this-vm"], MODELS)
    for model in layout.models.values():
        assert sorted(w.cpus for w in model.workers) == [(0,), (1,)]
        assert {w.threads for w in model.workers} == {1} and model.allocator == "tcmalloc"
    assert layout.frontend_cpus == (0, 1)  # too small to reserve a core
    # One model alone gets every core as well (what a bench row serves).
    assert [w.cpus for w in plan_layout(MACHINES["this-vm"], MODELS[:1]).models["resnet50"].workers] == [(0,), (1,)]


def test_one_allowed_cpu_gives_each_model_one_worker_there():
    layout = plan_layout(MACHINES["this-vm-taskset-1"], MODELS)
    assert {name: [w.cpus for w in m.workers] for name, m in layout.models.items()} == {
        "resnet50": [(1,)],
        "bert": [(1,)],
        "minilm": [(1,)],
    }


def test_a_big_server_partitions_cores_by_traffic_share():
    xeon = MACHINES["xeon-2s"]
    layout = plan_layout(xeon, [Demand("resnet50", 2), Demand("bert"), Demand("minilm")])
    assert layout.capacity == 56 and layout.serving_cores == 49  # 7 cores for the frontend
    counts = {name: len(m.workers) for name, m in layout.models.items()}
    assert counts == {"resnet50": 25, "bert": 12, "minilm": 12}  # 49 cores split 2:1:1, nothing shared
    assert set(layout.frontend_cpus) == {c for core in xeon.cores[-7:] for c in core.cpus}  # with siblings


def test_latency_runs_one_worker_per_l3_domain():
    epyc = plan_layout(MACHINES["epyc-96c"], MODELS[:1], Objective.LATENCY)
    workers = epyc.models["resnet50"].workers
    # 96 cores, 12 reserved for the frontend (the last CCD and a half): 10 whole CCDs + 4 cores.
    assert [w.threads for w in workers] == [8] * 10 + [4]
    xeon = plan_layout(MACHINES["xeon-2s"], MODELS, Objective.LATENCY)
    # Three models on two sockets: each socket's L3 domain splits so no two models share cores.
    threads = [w.threads for m in xeon.models.values() for w in m.workers]
    assert sum(threads) == xeon.serving_cores and max(threads) <= 28


def test_bad_plan_inputs_name_the_problem():
    with pytest.raises(PlanError, match="bert=two.*must be a number, e.g. bert=2"):
        Demand.parse("bert=two")
    with pytest.raises(PlanError, match="named twice"):
        plan_layout(MACHINES["this-vm"], [Demand("bert"), Demand("bert")])
    with pytest.raises(TopologyError, match="allowed CPUs 7 are not in the lscpu description"):
        machine("this-vm-2c", allowed="7")
    with pytest.raises(TopologyError, match="not like 0-3,8"):
        parse_cpus("0-x")


def test_every_machine_plans_every_model_subset():
    for topology, count in itertools.product(MACHINES.values(), (1, 2, 3)):
        layout = plan_layout(topology, MODELS[:count])
        assert len(layout.models) == count


@pytest.mark.parametrize(
    ("name", "counts"),
    [
        ("xeon-2s", [2, 4, 8, 16, 28]),  # one L3 per 28-core socket
        ("epyc-96c", [2, 4, 8]),  # 8-core CCDs
        ("desktop-16c", [2, 4, 8, 16]),
        ("container-8cpus-quota-4.5", [2, 4]),  # four cores of quota
        ("this-vm", [2]),
        ("this-vm-taskset-1", []),  # one core: nothing beyond the plan's own row
    ],
)
def test_tune_tries_cores_per_worker_up_to_an_l3_domain(name, counts):
    assert thread_counts(MACHINES[name]) == counts


@pytest.mark.parametrize("objective", list(Objective))
def test_a_model_that_batches_its_own_requests_gets_one_worker_per_l3_domain(objective):
    epyc = MACHINES["epyc-96c"]
    layout = plan_layout(epyc, [Demand("lm", grouping=Grouping.DOMAIN), Demand("bert")], objective)
    cores = {core.cpu: core for core in epyc.cores}
    lm, bert = layout.models["lm"].workers, layout.models["bert"].workers
    domains = [{(cores[c].node, cores[c].l3) for c in w.cpus} for w in lm]
    assert all(len(d) == 1 for d in domains) and len({*map(frozenset, domains)}) == len(lm)  # one per domain
    assert all(w.threads == len(w.cpus) for w in lm) and max(w.threads for w in lm) == 8  # a whole CCX
    # The cores it would have had anyway, merged; the other model's workers as the objective says.
    plain = plan_layout(epyc, [Demand("lm"), Demand("bert")], objective)
    assert sorted(c for w in lm for c in w.cpus) == sorted(c for w in plain.models["lm"].workers for c in w.cpus)
    assert bert == plain.models["bert"].workers
    if objective is Objective.THROUGHPUT:
        assert {w.threads for w in bert} == {1}
    # This VM: one worker on both cores, where a classifier gets two single-threaded ones.
    alone = plan_layout(MACHINES["this-vm"], [Demand("lm", grouping=Grouping.DOMAIN)], objective)
    assert [w.cpus for w in alone.models["lm"].workers] == [(0, 1)]


@pytest.mark.parametrize("objective", list(Objective))
def test_a_model_torchserve_must_give_one_worker_gets_one_over_all_its_cores(objective):
    xeon = MACHINES["xeon-2s"]  # two sockets, a node each
    layout = plan_layout(xeon, [Demand("lm", grouping=Grouping.ONE), Demand("bert")], objective)
    plain = plan_layout(xeon, [Demand("lm"), Demand("bert")], objective)
    ((lm,),) = [layout.models["lm"].workers]
    assert sorted(lm.cpus) == sorted(c for w in plain.models["lm"].workers for c in w.cpus)  # the same cores
    assert lm.threads == len(lm.cpus) and layout.models["bert"].workers == plain.models["bert"].workers
    cores = {core.cpu: core for core in xeon.cores}
    spans = len({cores[c].node for c in lm.cpus}) > 1
    assert lm.numa_node == (INTERLEAVED if spans else cores[lm.cpus[0]].node)
    alone = plan_layout(xeon, [Demand("lm", grouping=Grouping.ONE)], objective).models["lm"].workers
    assert len(alone) == 1 and alone[0].numa_node == INTERLEAVED  # every core of both sockets
