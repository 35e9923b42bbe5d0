"""Serving under a real cgroup memory limit, as a Kubernetes pod's `memory:` sets it: the plan reads
the limit and the workers' recorded footprints, and comes up READY with fewer, wider workers (a
layout over the limit is OOM-killed: seen in `dmesg`, docs/deployment.md#memory); without a
footprint, one wide worker per model starts and READY records it."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from kit.cgroup import CGROUP
from kit.footprint import Footprint, footprint_file, recorded
from kit.layout import MemoryPlan, frontend_heap
from kit.serve_config import ServeConfig
from kit.topology import read_topology
from tests.e2e.conftest import start_server

pytestmark = pytest.mark.e2e

# Inductor MiniLM under a limit (~0.5 GB a worker; a start compiles half of BERT-base's CPU time);
# BERT-base for the OOM kill, whose limit is set below what one of its workers holds.
MODEL = "minilm"
OOM_MODEL = "bert"
MiB = 2**20


def memory_cgroup(name: str) -> tuple[Path, str]:
    """A child of this process's memory cgroup (v1 or v2) and the file that limits it."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUP / "memory" / path.lstrip("/") / name, "memory.limit_in_bytes"
    path = Path("/proc/self/cgroup").read_text().splitlines()[-1].split(":", 2)[2]
    parent = CGROUP / path.lstrip("/")
    if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
        raise OSError(f"{parent} does not delegate the memory controller")
    return parent / name, "memory.max"


# A cgroup a name each: a stopped server's processes can outlive its stop() by a moment, and the
# rmdir of a cgroup that still holds one fails; the next test's cgroup of the same name then
# existed, and that test was skipped.
CGROUPS = itertools.count()
EMPTIED_S = 30


@contextlib.contextmanager
def limited(limit: int):
    """A memory cgroup limited to `limit` bytes; `enter()` moves this process in, `leave()` out
    (children started in between stay, as `systemd-run -p MemoryMax=` would start them)."""
    name = f"kit-e2e-{os.getpid()}-{next(CGROUPS)}"
    try:
        directory, limit_file = memory_cgroup(name)
        directory.mkdir()
        (directory / limit_file).write_text(str(limit))
    except OSError as error:
        pytest.skip(f"cannot create a memory cgroup here ({error}); needs root and a writable cgroup tree")
    origin = directory.parent

    class Cgroup:
        path = directory

        def enter(self) -> None:
            (directory / "cgroup.procs").write_text(str(os.getpid()))

        def leave(self) -> None:
            (origin / "cgroup.procs").write_text(str(os.getpid()))

    try:
        yield Cgroup()
    finally:
        if name in Path(f"/proc/{os.getpid()}/cgroup").read_text():
            Cgroup().leave()
        deadline = time.monotonic() + EMPTIED_S  # the servers' last processes exiting
        while (directory / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(OSError):
            directory.rmdir()


def start_in(cgroup, run_dir: Path, config: ServeConfig):
    cgroup.enter()
    try:
        return start_server(run_dir, config)
    finally:
        cgroup.leave()


def post(server, text: str) -> requests.Response:
    return requests.post(
        server.api.url("inference", f"/predictions/{MODEL}"),
        data=text.encode(),
        headers={"Content-Type": "text/plain"},
        timeout=60,
    )


def short_of(footprint: Footprint, workers: int) -> int:
    """The limit, in whole pages, a quarter worker below what the plan needs for `workers` workers
    of `footprint` under that limit (its frontend's allotment and headroom grow with the limit: a
    fixed point, reached as their growth is a fraction of the limit's). Not from the running
    frontend's RSS: a fresh JVM holds less than its allotment, so such a limit depended on what
    the server had served before (too small for even one worker when this test ran alone)."""
    limit = footprint.cost(workers)
    for _ in range(100):
        plan = MemoryPlan(limit, {MODEL: footprint.cost(workers)}, frontend_heap(limit))
        following = plan.total - footprint.per_worker // 4
        if following == limit:
            break
        limit = following
    return limit - limit % os.sysconf("SC_PAGE_SIZE")  # the kernel keeps whole pages


def test_a_memory_limit_gets_fewer_wider_workers_and_stays_up(tmp_path, optimized_server):
    config = ServeConfig.from_preset("optimized", variant="inductor", models=(MODEL,))
    archive = config.variant_of(MODEL).archive(MODEL)
    machine = read_topology()
    workers = len(config.layout(dataclasses.replace(machine, memory=None)).models[MODEL].workers)
    if workers < 2:
        pytest.skip("one usable core: the plan has no fewer workers to fall back to")

    # 1. Unlimited (the shared optimized server, Inductor): the footprint was recorded once READY
    #    (by it, or by a later server of the same archive).
    assert optimized_server.config.variant_of(MODEL).archive(MODEL) == archive
    footprint = recorded(archive, config.batch_size)
    assert footprint is not None, f"no footprint recorded at {footprint_file(archive, config.batch_size)}"

    # 2. A limit a quarter worker short of the full layout as planned (the recorded footprint, the
    #    frontend's allotment and the headroom), in which the plan fits fewer workers.
    limit = short_of(footprint, workers)
    reduced = config.layout(dataclasses.replace(machine, memory=dataclasses.replace(machine.memory, limit=limit)))
    assert len(reduced.models[MODEL].workers) < workers and reduced.memory.total <= limit, reduced.summary()

    with limited(limit) as cgroup:
        server = start_in(cgroup, tmp_path / "limited", config)
        try:
            assert server.layout.memory.budget == limit  # read from the cgroup, not given
            served = server.api.workers()
            assert len(served) == len(reduced.models[MODEL].workers)
            for worker in served:
                assert cgroup.path.name in Path(f"/proc/{worker.process.pid}/cgroup").read_text()
            pids = {w.process.pid for w in served}
            for text in ["short", "a somewhat longer review of a film " * 20] * 10:
                response = post(server, text)
                assert response.status_code == 200, response.text
            assert {w.process.pid for w in server.api.workers()} == pids  # no worker was killed and restarted
        finally:
            server.stop()

        # 3. Never measured (a rebuilt archive, a fresh image): under the limit, one wide worker
        #    starts instead of the full layout of unknown size, and READY records the footprint.
        footprint_file(archive, config.batch_size).unlink()
        server = start_in(cgroup, tmp_path / "unmeasured", config)
        try:
            assert "until then one worker each under the limit" in server.layout.unplanned
            assert len(server.api.workers()) == 1 and post(server, "short").status_code == 200
        finally:
            server.stop()
        assert recorded(archive, config.batch_size) is not None


# Starts the server from inside the cgroup and prints why the start failed. A child, not this
# process: the cgroup's OOM killer takes the largest process in it, and pytest (torch and every
# earlier test's models loaded) can be larger than the worker it should take.
START_IN_CGROUP = """
import os, sys
from pathlib import Path
from kit.serve_config import ServeConfig
from kit.server import ServerError, start_ready
Path(sys.argv[1]).write_text(str(os.getpid()))
config = ServeConfig.from_preset("optimized", variant="inductor", models=(sys.argv[3],))
try:
    start_ready(config, Path(sys.argv[2]), 300, progress=print)
except ServerError as error:
    print(f"START FAILED: {error}")
    sys.exit(3)
"""


def test_a_worker_the_kernel_oom_kills_is_named_so(tmp_path):
    """TorchServe says only "Backend worker process died" (exit 137); the kit says the kernel's OOM
    killer took it, under which limit, and what to do."""
    config = ServeConfig.from_preset("optimized", variant="inductor", models=(OOM_MODEL,))
    footprint = footprint_file(config.variant_of(OOM_MODEL).archive(OOM_MODEL), config.batch_size)
    aside = tmp_path / footprint.name
    # Below what one BERT worker holds that the kernel cannot reclaim (its own ~810 MiB; its
    # mapped files, ~500 MiB more of its RSS, are given back under the limit). 1 GiB held it once
    # the worker stopped compiling Inductor's precompiled header at every start (g++'s memory).
    limit = 640 * MiB
    with limited(limit) as cgroup:
        if footprint.is_file():  # measured: the plan would refuse before starting (tested in test_plan)
            shutil.move(footprint, aside)
        try:
            started = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    START_IN_CGROUP,
                    str(cgroup.path / "cgroup.procs"),
                    str(tmp_path / "run"),
                    OOM_MODEL,
                ],
                capture_output=True,
                text=True,
                timeout=600,
                cwd=Path(__file__).resolve().parents[2],
            )
        finally:
            if aside.is_file():
                shutil.move(aside, footprint)
    assert started.returncode == 3, started.stdout + started.stderr
    # The worker is the largest process there, but which one dies is the kernel's choice: the
    # frontend at times ("TorchServe exited during start-up"); either way the message says why.
    assert "START FAILED: " in started.stdout, started.stdout
    assert re.search(
        r"the kernel's OOM killer killed \d+ process\(es\) of this server since it started "
        r"\(memory limit 640 MiB\): give it more memory",
        started.stdout,
    ), started.stdout
