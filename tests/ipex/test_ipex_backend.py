"""The ipex backends against eager, run with .venv-ipex's python (`make test` does):

.venv-ipex/bin/python -m pytest tests/ipex
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("intel_extension_for_pytorch", reason="needs .venv-ipex: run `make install-ipex`")

from handlers.architectures.text import BertClassifier  # noqa: E402
from handlers.archive import extract, load_archived  # noqa: E402
from handlers.optimize import optimize  # noqa: E402
from handlers.settings import ImageSettings, SettingsError, TextSettings, parse_settings  # noqa: E402
from handlers.text_classification import text_example  # noqa: E402
from kit.variant import Variant  # noqa: E402

# ipex.optimize folds BN and prepacks oneDNN weights, like Inductor's freezing: fp32 to ~1e-5.
FP32_TOL = {"rtol": 1e-4, "atol": 1e-4}


def served(optimized, inputs):
    with torch.inference_mode():
        return optimized(*inputs)


def eager(model, inputs, channels_last=False):
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = tuple(t.contiguous(memory_format=torch.channels_last) for t in inputs)
    with torch.inference_mode():
        return model(*inputs)


@pytest.mark.parametrize("backend", ["ipex", "ipex-compile"])
def test_image_backend_matches_eager(tiny_cnn, backend):
    x1, x4 = (torch.randn(1, 3, 64, 64),), (torch.randn(4, 3, 64, 64),)
    optimized = optimize(tiny_cnn, parse_settings(ImageSettings, {"backend": backend}), [x1, x4])
    assert optimized.backend.value == backend
    for inputs in (x1, x4):  # every warmed-up batch size
        torch.testing.assert_close(served(optimized, inputs), eager(tiny_cnn, inputs, channels_last=True), **FP32_TOL)


def test_text_backend_matches_eager_with_padding(tiny_bert_config):
    torch.manual_seed(0)
    model = BertClassifier(tiny_bert_config).eval()
    inputs = text_example(2, 32)  # half-padded rows
    optimized = optimize(model, parse_settings(TextSettings, {"backend": "ipex", "max_length": 32}), [inputs])
    torch.testing.assert_close(served(optimized, inputs), eager(model, inputs), **FP32_TOL)


def test_ipex_keeps_to_float32():
    with pytest.raises(SettingsError, match="backend 'ipex' does not serve dtype 'bfloat16'"):
        parse_settings(ImageSettings, {"backend": "ipex", "dtype": "bfloat16", "fallback_to_eager": True})


@pytest.mark.parametrize("model", ["resnet50", "bert"])
def test_served_models_match_eager(model, tmp_path):
    archive = Variant.load("ipex").archive(model)
    if not archive.is_file():
        pytest.fail(f"{archive} missing: `make archive VARIANTS=ipex` (make test builds it)")
    archived = load_archived(extract(archive, tmp_path))
    inputs = archived.example(1)
    optimized = optimize(archived.model, archived.settings, [inputs])
    assert optimized.backend.value == "ipex"
    reference = eager(archived.model, inputs, channels_last=archived.settings.channels_last)
    torch.testing.assert_close(served(optimized, inputs), reference, **FP32_TOL)
