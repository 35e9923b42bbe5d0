"""ResNet-50 and MiniLM served by TorchServe from .venv-ipex (torch 2.8 + IPEX), over real HTTP,
against eager references computed in this (main, torch 2.13) environment. MiniLM is the text model:
the same text path as BERT's at a fifth of its archives' disk (tests/ipex covers BERT in-process)."""

from __future__ import annotations

import pytest

from kit.serve_config import ServeConfig
from kit.variant import Variant
from tests.e2e.conftest import start_server
from tests.e2e.test_serving import assert_minilm_matches_eager, assert_resnet50_matches_eager

pytestmark = [pytest.mark.e2e, pytest.mark.ipex]


@pytest.fixture(scope="module")
def ipex_server(tmp_path_factory):
    venv = Variant.load("ipex").environment
    if not (venv / "bin" / "torchserve").is_file():
        pytest.fail(f"{venv} is not built: run `make install-ipex` (make test does)")
    config = ServeConfig.from_preset("optimized", variant="ipex", models=["resnet50", "minilm"])
    server = start_server(tmp_path_factory.mktemp("ipex"), config)
    yield server
    server.stop()


def test_workers_run_in_the_ipex_environment(ipex_server):
    workers = ipex_server.api.workers()
    planned = ipex_server.layout.models  # the plan made from this machine at start (kit/plan.py)
    assert sorted(w.model for w in workers) == sorted(m for m in planned for _ in planned[m].workers)
    for worker in workers:
        assert worker.process and worker.process.allocator == "tcmalloc"
        with open(f"/proc/{worker.process.pid}/maps") as maps:
            assert "intel_extension_for_pytorch" in maps.read(), f"{worker.model}: IPEX not loaded"
    assert "backend=ipex" in ipex_server.logs.model_log.read_text()


def test_ipex_resnet50_matches_eager_reference(ipex_server):
    assert_resnet50_matches_eager(ipex_server)


def test_ipex_minilm_matches_eager_reference(ipex_server):
    assert_minilm_matches_eager(ipex_server)
