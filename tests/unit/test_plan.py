"""The topology reader and the layout planner on machine classes users serve from.

Fixtures in tests/fixtures/lscpu/ are `lscpu -p=CPU,CORE,SOCKET,NODE,CACHE` texts: this VM's
own (recorded), and ones written in lscpu's format from the documented numbering of each
machine class (two-socket Xeon with SMT, a 96-core EPYC with 12 CCDs, a 16-core desktop with
adjacent SMT siblings, a 64-core two-node host seen from a container).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from kit.plan import (
    FRONTEND_FRACTION,
    MIN_CORES_TO_RESERVE,
    Demand,
    Objective,
    PlanError,
    plan_layout,
    thread_counts,
)
from kit.topology import (
    Memory,
    TopologyError,
    cgroup_memory_limit,
    cgroup_quota,
    format_cpus,
    oom_kills,
    parse_cpus,
    parse_size,
    parse_topology,
    read_memory,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "lscpu"
MODELS = [Demand("resnet50"), Demand("bert"), Demand("minilm")]


def machine(name: str, allowed: str | None = None, quota: float | None = None):
    text = (FIXTURES / f"{name}.txt").read_text()
    return parse_topology(text, parse_cpus(allowed) if allowed else None, quota)


MACHINES = {
    "xeon-2s": machine("xeon-2s-28c-smt"),
    "epyc-96c": machine("epyc-96c-12ccd-smt"),
    "desktop-16c": machine("desktop-16c-smt-adjacent"),
    "container-8cpus-quota-4.5": machine("host-64c-2node", allowed="28-35", quota=4.5),
    "this-vm": machine("this-vm-2c"),
    "this-vm-taskset-1": machine("this-vm-2c", allowed="1"),
}


def test_topology_reads_cores_smt_nodes_and_l3():
    xeon = MACHINES["xeon-2s"]
    assert (len(xeon.cpus), len(xeon.cores), xeon.nodes, xeon.l3_domains) == (112, 56, (0, 1), (0, 1))
    assert xeon.cores[0].cpus == (0, 56)  # SMT siblings of one core
    epyc = MACHINES["epyc-96c"]
    assert (len(epyc.cores), len(epyc.nodes), len(epyc.l3_domains)) == (96, 1, 12)
    desktop = MACHINES["desktop-16c"]
    assert desktop.cores[1].cpus == (2, 3)
    vm = MACHINES["this-vm"]
    assert (len(vm.cores), vm.capacity) == (2, 2)


def test_a_container_uses_its_cpuset_and_quota_not_the_host():
    container = MACHINES["container-8cpus-quota-4.5"]
    assert [c.id for c in container.cpus] == list(range(28, 36))
    assert container.nodes == (0, 1)  # the cpuset straddles the host's two NUMA nodes
    assert container.capacity == 4  # 4.5 CPUs of quota: four whole cores


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
    with pytest.raises(PlanError, match="bert=two.*must be a number"):
        Demand.parse("bert=two")
    with pytest.raises(PlanError, match="named twice"):
        plan_layout(MACHINES["this-vm"], [Demand("bert"), Demand("bert")])
    with pytest.raises(TopologyError, match="allowed CPUs 7 are not in the lscpu description"):
        machine("this-vm-2c", allowed="7")
    with pytest.raises(TopologyError, match="not like 0-3,8"):
        parse_cpus("0-x")


def test_cpu_lists_round_trip():
    for cpus in ({0}, {0, 1, 2, 3, 8}, {5, 7, 9}, set(range(64))):
        assert parse_cpus(format_cpus(cpus)) == cpus
    assert format_cpus([3, 0, 1, 2, 8]) == "0-3,8"


def write_tree(root, files: dict[str, str]) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "max 100000"}, None),
        ({"cpu.max": "250000 100000"}, 2.5),
        ({"kubepods/cpu.max": "400000 100000", "kubepods/pod1/cpu.max": "150000 100000"}, 1.5),
    ],
)
def test_cgroup_v2_quota_is_the_tightest_on_the_path(tmp_path, files, quota):
    write_tree(tmp_path, files)
    assert cgroup_quota("0::/kubepods/pod1\n", tmp_path) == quota


def test_cgroup_v1_quota(tmp_path):
    cpu = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("300000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota("4:cpu,cpuacct:/docker/abc\n1:memory:/docker/abc\n", tmp_path) == 3.0
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_quota("4:cpu,cpuacct:/docker/abc\n", tmp_path) is None


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"memory.max": "max\n"}, None),
        ({"kubepods/memory.max": "8589934592\n", "kubepods/pod1/memory.max": "max\n"}, 8 * 2**30),
        ({"kubepods/memory.max": "8589934592\n", "kubepods/pod1/memory.max": "6442450944\n"}, 6 * 2**30),
    ],
)
def test_cgroup_v2_memory_limit_is_the_tightest_on_the_path(tmp_path, files, limit):
    write_tree(tmp_path, files)
    assert cgroup_memory_limit("0::/kubepods/pod1\n", tmp_path) == limit


def test_cgroup_v1_memory_limit_and_its_unlimited_spelling(tmp_path):
    memory = tmp_path / "memory" / "docker" / "abc"
    memory.mkdir(parents=True)
    (memory / "memory.limit_in_bytes").write_text("4294967296\n")
    assert cgroup_memory_limit("4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n", tmp_path) == 4 * 2**30
    (memory / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert cgroup_memory_limit("3:memory:/docker/abc\n", tmp_path) is None


def test_oom_kills_are_read_from_the_nearest_memory_cgroup(tmp_path):
    events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"
    write_tree(tmp_path, {"kubepods/memory.events": "oom_kill 40\n", "kubepods/pod1/memory.events": events})
    assert oom_kills("0::/kubepods/pod1\n", tmp_path) == 2  # the pod's, not its parent's (other pods too)
    # A container sees its own cgroup at the root of the mount while /proc names the host's path.
    assert oom_kills("0::/kubepods/pod2\n", tmp_path / "kubepods" / "pod1") == 2
    write_tree(tmp_path, {"memory/docker/abc/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"})
    assert oom_kills("4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n", tmp_path) == 5  # cgroup v1
    write_tree(tmp_path, {"memory/old/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n"})
    assert oom_kills("3:memory:/old\n", tmp_path) is None  # a kernel before 4.13 does not count
    assert oom_kills("3:cpu:/x\n", tmp_path) is None  # no memory controller


def test_memory_is_read_from_meminfo_and_each_numa_node(tmp_path):
    for node, (total, free) in enumerate([(16, 10), (16, 12)]):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "meminfo").write_text(
            f"Node {node} MemTotal: {total * 2**20} kB\nNode {node} MemFree: {free * 2**20} kB\n"
        )
    memory = read_memory("0::/\n", tmp_path / "no-cgroup", tmp_path)
    assert memory.nodes == ((0, 16 * 2**30, 10 * 2**30), (1, 16 * 2**30, 12 * 2**30))
    assert memory.total > 0 and 0 < memory.available <= memory.total and memory.limit is None
    assert memory.budget == memory.total
    assert "node 1: 16.0 GiB, 12.0 GiB free" in memory.summary()
    assert Memory(32 * 2**30, 30 * 2**30, limit=6 * 2**30).budget == 6 * 2**30


def test_kit_topology_describes_another_machines_memory(capsys):
    from kit.__main__ import main

    lscpu = str(FIXTURES / "host-64c-2node.txt")
    assert main(["topology", "--lscpu", lscpu, "--cpus", "0-15", "--memory", "6Gi"]) == 0
    assert "memory: 6.0 GiB, 6.0 GiB available; cgroup memory limit 6.0 GiB" in capsys.readouterr().out
    assert main(["topology", "--lscpu", lscpu, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"] is None  # not read for another machine
    with pytest.raises(TopologyError, match="memory size '6 gigs' is not a size"):
        parse_size("6 gigs")
    assert (parse_size("8Gi"), parse_size("6GiB"), parse_size("512Mi"), parse_size("2G")) == (
        8 * 2**30, 6 * 2**30, 512 * 2**20, 2 * 10**9,
    )  # fmt: skip


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
