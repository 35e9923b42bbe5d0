"""Serving under a restricted CPU set, as `taskset -c N make serve` or a one-CPU container runs it:
the plan adapts (one worker per model, on that CPU) and nothing runs outside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests

from bench.payloads import body_for
from kit.models import Model
from kit.serve_config import ServeConfig
from tests.conftest import BUNDLED_MODELS
from tests.e2e.conftest import start_server

pytestmark = pytest.mark.e2e


def allowed_list(pid: int) -> str:
    """Cpus_allowed_list of /proc/PID/status, as the kernel reports it."""
    line = next(
        line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Cpus_allowed_list")
    )
    return line.split(":", 1)[1].strip()


def test_a_one_cpu_set_gets_one_worker_per_model_on_that_cpu(tmp_path):
    # Precompiled int8 archives: workers start in seconds on one CPU (BERT's AOTInductor package
    # takes 5 min to build, so make test-archives builds its OpenVINO one only).
    config = ServeConfig.from_preset(
        "optimized", variant="aoti-int8", models=BUNDLED_MODELS, model_variants={"bert": "openvino-int8"}
    )
    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)
    os.sched_setaffinity(0, {cpu})  # as `taskset -c CPU` would start the kit; its children inherit it
    try:
        server = start_server(tmp_path, config)
    finally:
        os.sched_setaffinity(0, allowed)
    try:
        workers = server.api.workers()
        assert sorted(w.model for w in workers) == list(BUNDLED_MODELS)  # one each
        for worker in workers:
            assert allowed_list(worker.process.pid) == str(cpu), worker
        for process in server.process_tree():  # the frontend and the torchserve CLI too
            assert allowed_list(process.pid) == str(cpu), process.cmdline()[:3]
        for name in BUNDLED_MODELS:
            body = body_for(Model.load(name))
            response = requests.post(
                server.api.url("inference", f"/predictions/{name}"),
                data=body.data,
                headers={"Content-Type": body.content_type},
                timeout=60,
            )
            assert response.status_code == 200, response.text
    finally:
        server.stop()
