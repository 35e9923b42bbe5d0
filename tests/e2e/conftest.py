"""A real TorchServe with the optimized preset on free ports, shared by the e2e tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

from handlers.archive_files import is_archive
from kit.serve_config import ServeConfig
from kit.server import START_DEADLINE_S, Server, start_ready
from tests.conftest import BUNDLED_MODELS


def one_cpu() -> str:
    """A CPU set of one usable CPU: the plan then gives each model exactly one worker."""
    return str(max(os.sched_getaffinity(0)))


def start_server(run_dir: Path, config: ServeConfig) -> Server:
    missing = [str(path) for path in config.archives().values() if not is_archive(path)]
    if missing:
        pytest.fail(f"archives {missing} missing: run `make archive` (make test does)")
    return start_ready(config, run_dir, START_DEADLINE_S)


# make test runs the e2e tests in two processes, a group of tests each at a time: a module's tests
# are a group, so that its servers and archives are made once; these modules, which ask for the
# session's optimized server, are one group, so that one process starts it (each worker compiles its
# model's graphs at its start: Inductor's frozen graphs are not cached);
# so is each package of modules sharing package-scoped servers (generation/: its language models'
# servers of three variants). The groups are drawn here, whatever --dist says, not by xdist's
# --dist loadgroup: xdist 3.8 marks a test's group in its `_nodeid`, which pytest 9 no longer reads.
SHARED = "optimized_server"
ON_OPTIMIZED_SERVER = ("test_bad_input.py", "test_fuzz.py", "test_grpc.py", "test_memory_limit.py", "test_serving.py")
PACKAGES = ("tests/e2e/generation/",)


# The groups that take minutes, longest first (a fresh-clone CI's --durations at 7c8cc42: 320 to
# 80 s each); the others follow in collection order. The groups go to whichever process is free, in
# this order: the longest first leaves short ones to even out the two processes' ends. xdist's own
# order (the most tests first) left test_lm_plan's 3 tests and test_ports' 5 for last in the
# end-to-end part, and test_bench's one test after test_ipex_serving's in the IPEX part: in each,
# one process ran alone for 80-90 s at the end.
LONGEST_FIRST = (
    "tests/e2e/test_bench.py",  # the IPEX part's (marker ipex)
    "tests/e2e/test_your_model.py",
    "tests/e2e/generation/",
    SHARED,
    "tests/e2e/test_lm_precision.py",
    "tests/integration/test_diagnose.py",
    "tests/e2e/test_lm_plan.py",
    "tests/e2e/test_served_accuracy.py",
    "tests/e2e/test_ports.py",
    "tests/e2e/test_batching.py",
)


def group_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    if module.rsplit("/", 1)[-1] in ON_OPTIMIZED_SERVER:
        return SHARED
    return next((package for package in PACKAGES if module.startswith(package)), module)


class ModuleGroups(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> ModuleGroups:
    config.option.loadscopereorder = False  # the groups in the items' order (below), not by their sizes
    return ModuleGroups(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The items in LONGEST_FIRST's order of their groups (a stable sort: each group's own order
    kept). A module on the session's optimized server that is not in ON_OPTIMIZED_SERVER would
    start one more: refused by name."""
    rank = {group: index for index, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(rank)))
    strays = {item.path.name for item in items if SHARED in getattr(item, "fixturenames", ())}
    if strays := strays - set(ON_OPTIMIZED_SERVER):
        raise pytest.UsageError(f"{sorted(strays)} use {SHARED}: add them to ON_OPTIMIZED_SERVER")


@pytest.fixture(scope="session")
def optimized_server(tmp_path_factory) -> Server:
    # On one CPU: a worker per model. The plan on 2 CPUs has two each, and each worker compiles
    # its own frozen graphs: twice the compile work before READY, for checks that need one.
    # test_batching.py checks the workers of a plan over every CPU, on precompiled archives.
    config = ServeConfig.from_preset("optimized", models=BUNDLED_MODELS, cpus=one_cpu())
    server = start_server(tmp_path_factory.mktemp("optimized"), config)
    yield server
    server.stop()
