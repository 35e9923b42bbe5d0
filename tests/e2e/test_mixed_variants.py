"""One server, each model on its own variant (what `make tune` writes when backends win on
different models): each worker runs its variant's backend with that backend's allocator,
read from /proc, and both models answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from bench.payloads import body_for
from kit.models import Model
from kit.serve_config import ServeConfig
from tests.e2e.conftest import one_cpu, start_server

pytestmark = pytest.mark.e2e


def maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_models_of_different_variants_share_one_server(tmp_path):
    # Precompiled archives on one CPU: one worker per model, ready in seconds.
    config = ServeConfig.from_preset(
        "optimized",
        variant="aoti-int8",
        models=["resnet50", "bert"],
        model_variants={"bert": "openvino-int8"},
        cpus=one_cpu(),
    )
    server = start_server(tmp_path, config)
    try:
        assert server.model_store == tmp_path.resolve() / "model_store"  # the two variants' archives, linked
        workers = {w.model: w.process for w in server.api.workers()}
        assert sorted(workers) == ["bert", "resnet50"]
        assert workers["resnet50"].allocator == "tcmalloc" and "libopenvino" not in maps(workers["resnet50"].pid)
        # OpenVINO crashes under a preloaded allocator: its worker keeps glibc malloc.
        assert workers["bert"].allocator == "default" and "libopenvino" in maps(workers["bert"].pid)
        for name in workers:
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
