"""handlers/itt.py: one ITT range per inference call, closed on errors, off by a switch; op ranges."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import encode_image
from tests.unit.handlers.serving import RangeRecorder, image_handler, serve


def test_one_itt_range_per_inference_call(image_archive, monkeypatch):
    handler, context = image_handler(image_archive, batch_size=2, backend="eager")
    recorder = RangeRecorder()
    recorder.install(monkeypatch)
    serve(handler, context, [{"body": encode_image("RGB", (40, 40))}] * 2)
    serve(handler, context, [{"body": encode_image("RGB", (40, 40))}])
    assert recorder.events == ["push tiny:bs2", "pop", "push tiny:bs1", "pop"]


def test_itt_range_closes_when_inference_raises(image_archive, monkeypatch):
    handler, context = image_handler(image_archive, backend="eager")
    recorder = RangeRecorder()
    recorder.install(monkeypatch)

    def explode(*inputs):
        raise RuntimeError("boom")

    object.__setattr__(handler.optimized, "run", explode)  # frozen dataclass: bypass for the test
    with pytest.raises(RuntimeError, match="boom"):
        serve(handler, context, [{"body": encode_image("RGB", (40, 40))}])
    assert recorder.events == ["push tiny:bs1", "pop"]


def test_itt_switch_off_opens_no_range(image_archive, monkeypatch):
    handler, context = image_handler(image_archive, backend="eager", itt=False)
    recorder = RangeRecorder()
    recorder.install(monkeypatch)
    serve(handler, context, [{"body": encode_image("RGB", (40, 40))}])
    assert recorder.events == []


class OpRangeRecorder:
    entered = 0

    def __enter__(self):
        OpRangeRecorder.entered += 1

    def __exit__(self, *exc_info):
        return False


@pytest.mark.parametrize(("value", "expected"), [("1", 2), ("", 0)], ids=["on", "off"])
def test_op_level_itt_switch(image_archive, monkeypatch, value, expected):
    monkeypatch.setenv("KIT_ITT_OPS", value)
    monkeypatch.setattr(torch.autograd.profiler, "emit_itt", OpRangeRecorder)
    OpRangeRecorder.entered = 0
    handler, context = image_handler(image_archive, backend="eager")
    for _ in range(2):
        serve(handler, context, [{"body": encode_image("RGB", (40, 40))}])
    assert OpRangeRecorder.entered == expected
