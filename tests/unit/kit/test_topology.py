"""kit/topology.py: the machine as a process may use it, on machine classes users serve from
(tests/machines.py) and from /proc files written in the test."""

from __future__ import annotations

import json

import pytest

from kit.topology import (
    Memory,
    TopologyError,
    format_cpus,
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
        8 * 2**30,
        6 * 2**30,
        512 * 2**20,
        2 * 10**9,
    )
