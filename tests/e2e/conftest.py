"""A real TorchServe with the optimized preset on free ports, shared by the e2e tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def optimized_server(tmp_path_factory) -> Server:
    server = start_server(
        tmp_path_factory.mktemp("optimized"), ServeConfig.from_preset("optimized", models=BUNDLED_MODELS)
    )
    yield server
    server.stop()
