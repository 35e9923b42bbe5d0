"""A language model's linear weights in int8 (torchao's weight-only quantization), computed in the
model's dtype.

    count = int8_weights(model)    # after model.to(dtype), before torch.compile

Each weight keeps one scale per output channel (symmetric, round to nearest): a decode step reads
half of bfloat16's bytes, a quarter of float32's, and its answers move by the rounding, which
the accuracy guard measures before serving (handlers/generation/agreement.py). Inductor compiles
the dequantize into the matrix product (torch's `_weight_int8pack_mm`). A head tied to the
embedding gets its own int8 copy; the embedding keeps its float table (a lookup reads one row).
"""

from __future__ import annotations

from torch import nn


def int8_weights(model: nn.Module) -> int:
    """Every nn.Linear's weight in int8; how many there were."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_  # torchao's import costs seconds

    count = sum(1 for module in model.modules() if type(module) is nn.Linear)
    quantize_(model, Int8WeightOnlyConfig(), filter_fn=lambda module, _: type(module) is nn.Linear)
    return count
