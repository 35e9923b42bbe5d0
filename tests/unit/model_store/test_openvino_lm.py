"""Which IR a language model's openvino variant is exported as (model_store/openvino_lm.py)."""

from __future__ import annotations

import pytest

from model_store.openvino_lm import IrWeights, ir_weights


@pytest.mark.parametrize(
    ("dtype", "int8", "expected"),
    [
        ("float32", False, IrWeights.FLOAT32),  # float32 computed from its own weights, exactly
        ("bfloat16", False, IrWeights.FLOAT16),  # half the IR mapped beside the plugin's bf16 copy
        ("bfloat16", True, IrWeights.INT8),
        ("float32", True, IrWeights.INT8),
    ],
)
def test_each_precision_is_exported_with_its_weights(dtype, int8, expected):
    assert ir_weights(dtype, int8) is expected
