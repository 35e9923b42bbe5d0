"""Start/stop behaviour of the kit's server wrapper, on the baseline preset (eager, no pinning)."""

from __future__ import annotations

import os

import psutil
import pytest
import requests

from kit.serve_config import ServeConfig
from kit.server import ServerError
from kit.server_state import STATE_FILE
from tests.e2e.conftest import start_server

pytestmark = pytest.mark.e2e


def test_baseline_uses_torchserve_defaults_and_stops_cleanly(tmp_path):
    # MiniLM: the smallest text model. Eager workers on every CPU each warm up every length bucket,
    # oversubscribed as TorchServe's defaults are: with BERT-base that took 113 s of CI's time.
    server = start_server(tmp_path, ServeConfig.from_preset("baseline", models=["minilm"]))
    try:
        workers = server.api.workers()
        # TorchServe's default: one worker per CPU it may use, no pinning, glibc malloc.
        assert len(workers) == len(os.sched_getaffinity(0))
        assert {w.process.allocator for w in workers} == {"default"}
        response = requests.post(
            server.api.url("inference", "/predictions/minilm"),
            data=b"plain eager",
            headers={"Content-Type": "text/plain"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        with pytest.raises(ServerError, match="already running"):
            server.start()
        tree = server.process_tree()
        assert len(tree) >= 2 + len(workers)  # torchserve wrapper, java, workers
    finally:
        server.stop()
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "processes left behind"
    assert not (server.run_dir / STATE_FILE).exists()
