"""The ipex backends against eager, run with .venv-ipex's python (`make test` does):

.venv-ipex/bin/python -m pytest tests/ipex
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("intel_extension_for_pytorch", reason="needs .venv-ipex: run `make install-ipex`")

from handlers.architectures.text import BertClassifier  # noqa: E402
from handlers.archive import load_archived  # noqa: E402
from handlers.archive_files import is_archive  # noqa: E402
from handlers.backends import bf16_isa, cpu_flags  # noqa: E402
from handlers.optimize import optimize  # noqa: E402
from handlers.settings import ImageSettings, TextSettings  # noqa: E402
from handlers.text_classification import text_example  # noqa: E402
from handlers.typed_config import SettingsError, parse_settings
from kit.variant import Variant  # noqa: E402

# ipex.optimize folds BN and prepacks oneDNN weights, like Inductor's freezing: fp32 to ~1e-5.
FP32_TOL = {"rtol": 1e-4, "atol": 1e-4}
# bfloat16 keeps 8 mantissa bits: ~1e-2 relative on logits of this size (as tests/unit/handlers/test_optimize.py).
BF16_TOL = {"rtol": 5e-2, "atol": 5e-2}


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
    inputs = text_example(2, 32, 100)  # half-padded rows
    optimized = optimize(model, parse_settings(TextSettings, {"backend": "ipex", "max_length": 32}), [inputs])
    torch.testing.assert_close(served(optimized, inputs), eager(model, inputs), **FP32_TOL)


def test_ipex_compile_keeps_to_float32():
    with pytest.raises(SettingsError, match="backend 'ipex-compile' does not serve dtype 'bfloat16'"):
        parse_settings(ImageSettings, {"backend": "ipex-compile", "dtype": "bfloat16", "fallback_to_eager": True})


# Only a CPU that computes bf16 runs it (IPEX itself asserts so when it prepacks bf16 weights);
# elsewhere the kit's refusal is what a user gets (tests/unit/handlers/test_optimize.py).
@pytest.mark.skipif(bf16_isa(cpu_flags()) is None, reason="this CPU has neither AMX_BF16 nor AVX512_BF16")
def test_bf16_matches_eager(tiny_cnn, tiny_bert_config):
    torch.manual_seed(0)
    text_model = BertClassifier(tiny_bert_config).eval()
    cases = [
        (tiny_cnn, ImageSettings, {}, (torch.randn(2, 3, 64, 64),)),
        (text_model, TextSettings, {"max_length": 32}, text_example(2, 32, 100)),
    ]
    for model, kind, fields, inputs in cases:
        settings = parse_settings(kind, {"backend": "ipex", "dtype": "bfloat16", **fields})
        optimized = optimize(model, settings, [inputs])
        assert optimized.backend.value == "ipex" and optimized.accuracy_error is not None
        reference = eager(model, inputs, channels_last=settings.channels_last)
        torch.testing.assert_close(served(optimized, inputs), reference, **BF16_TOL)


# The archives make test-ipex builds; BERT's text path is covered at its size in the tests above.
@pytest.mark.parametrize("model", ["resnet50", "minilm"])
def test_served_models_match_eager(model):
    archive = Variant.load("ipex").archive(model)
    if not is_archive(archive):
        pytest.fail(f"{archive} missing: `make archive VARIANTS=ipex` (make test builds it)")
    archived = load_archived(archive)
    inputs = archived.example(1)
    optimized = optimize(archived.model, archived.settings, [inputs])
    assert optimized.backend.value == "ipex"
    reference = eager(archived.model, inputs, channels_last=archived.settings.channels_last)
    torch.testing.assert_close(served(optimized, inputs), reference, **FP32_TOL)
