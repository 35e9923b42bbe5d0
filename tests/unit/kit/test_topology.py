"""kit/topology.py: the machine as a process may use it, on machine classes users serve from
(tests/machines.py) and from cgroup and /proc files written in the test."""

from __future__ import annotations

import json

import pytest

from kit.topology import (
    Memory,
    TopologyError,
    cgroup_memory_limit,
    cgroup_quota,
    format_cpus,
    oom_kills,
    parse_cpus,
    parse_size,
    read_memory,
)
from tests.machines import FIXTURES, MACHINES


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
