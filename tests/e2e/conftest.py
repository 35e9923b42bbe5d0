"""A real TorchServe with the optimized preset on free ports, shared by the e2e tests."""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

import pytest

from kit.serve_config import ServeConfig
from kit.server import START_DEADLINE_S, Server, start_ready
from kit.variant import Variant
from tests.conftest import BUNDLED_MODELS


def one_cpu() -> str:
    """A CPU set of one usable CPU: the plan then gives each model exactly one worker."""
    return str(max(os.sched_getaffinity(0)))


def start_server(run_dir: Path, config: ServeConfig) -> Server:
    missing = [str(path) for path in config.archives().values() if not path.is_file()]
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


class ExtractedArchives:
    """The eager archives, each unpacked on first use into `root`."""

    def __init__(self, root: Path):
        self.root = root

    def __getitem__(self, name: str) -> Path:
        out = self.root / name
        if not out.is_dir():
            with zipfile.ZipFile(Variant.load("eager").archive(name)) as archive:
                archive.extractall(out)
        return out


@pytest.fixture(scope="module")
def extracted_archives(tmp_path_factory) -> ExtractedArchives:
    """The eager archives unpacked, for in-process references built from the same files: only
    those a module asks for, removed after it (BERT's alone is 0.4 GB, and a fresh CI machine's
    disk is what runs out)."""
    root = tmp_path_factory.mktemp("archives")
    yield ExtractedArchives(root)
    shutil.rmtree(root, ignore_errors=True)
