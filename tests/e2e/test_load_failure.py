"""A worker that cannot initialize fails loudly: `wait_ready` stops at once with the reason."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest
import requests
import torch
import yaml

from handlers.backends import bf16_isa, cpu_flags
from kit.paths import ROOT
from kit.serve_config import ServeConfig
from kit.server import ServerError, start_ready
from model_store.layout import pack
from tests.conftest import TinyCNN, encode_image
from tests.e2e.conftest import one_cpu

pytestmark = pytest.mark.e2e


def build_archive(store: Path, name: str, handler_settings: dict) -> None:
    staging = store.parent / f"{name}-files"
    staging.mkdir(parents=True)
    model = TinyCNN().eval()
    torch.export.save(torch.export.export(model, (torch.randn(1, 3, 224, 224),)), staging / "model.pt2")
    config = store.parent / f"{name}.yaml"
    config.write_text(yaml.safe_dump({"handler": {"architecture": "exported-program", **handler_settings}}))
    pack(name, ROOT / "handlers" / "image_classification.py", staging, config, store)


def test_bad_handler_setting_stops_start_up_with_the_reason(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    build_archive(store, "broken", {"bakend": "inductor"})
    config = ServeConfig.from_preset("optimized", models=["broken"], cpus=one_cpu())
    started = time.monotonic()
    with pytest.raises(ServerError, match="model load failed") as failure:  # start_ready stops it
        start_ready(config, tmp_path / "run", deadline_s=300, progress=lambda message: None, model_store=store)
    assert time.monotonic() - started < 120, "the failure should be reported long before the deadline"
    # The reason from the worker, in the message the user sees:
    assert "unknown setting(s) ['bakend']" in str(failure.value)


def test_bf16_starts_only_on_a_cpu_that_computes_it(tmp_path):
    """Refused with the reason where bf16 would be slower than float32; served where the CPU has it."""
    store = tmp_path / "store"
    store.mkdir()
    build_archive(store, "half", {"backend": "inductor", "dtype": "bfloat16"})
    config = ServeConfig.from_preset("optimized", models=["half"], cpus=one_cpu())
    start = functools.partial(start_ready, config, tmp_path / "run", 300, lambda message: None, model_store=store)
    if bf16_isa(cpu_flags()) is None:
        with pytest.raises(ServerError, match="model load failed") as failure:
            start()
        assert "dtype bfloat16 needs a CPU with AMX_BF16 or AVX512_BF16; this one has neither" in str(failure.value)
        return
    server = start()
    try:
        answer = requests.post(
            server.api.url("inference", "/predictions/half"), data=encode_image("RGB", (64, 64)), timeout=60
        )
        assert answer.status_code == 200 and len(answer.json()) == 5, answer.text  # top-5 classes
    finally:
        server.stop()
