"""Fixtures of the handlers' unit tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def image_archive(tmp_path, tiny_cnn):
    example = torch.randn(2, 3, 224, 224)
    # A dynamic batch dimension, as a user must export it to serve batches > 1.
    program = torch.export.export(tiny_cnn, (example,), dynamic_shapes={"x": {0: torch.export.Dim("batch", max=64)}})
    torch.export.save(program, tmp_path / "model.pt2")
    return tmp_path
