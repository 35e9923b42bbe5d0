"""kit/cgroup.py: CPU quota, memory limit and OOM kills from cgroup files written in the test
(v2 and v1, a container's own cgroup at the mount's root)."""

from __future__ import annotations

import pytest

from kit.cgroup import cgroup_memory_limit, cgroup_quota, oom_kills


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
