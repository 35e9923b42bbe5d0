"""handlers/generation/quantized.py: a language model's linear weights stored in int8, one scale per
output channel, the model still computing in its dtype (how close it answers: test_agreement.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from handlers.generation import quantized
from handlers.generation.linears import OpaqueLinear
from handlers.generation.quantized import Int8, int8_weights
from tests.hf_models import qwen2_lm
from tests.unit.handlers.generation.checkpoints import read_whole, resident_kb


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_linear_weight_is_int8_with_a_scale_per_output_channel(tmp_path, dtype):
    model = AutoModelForCausalLM.from_pretrained(qwen2_lm(tmp_path / "lm"), dtype=torch.float32).eval().to(dtype)
    shapes = [tuple(m.weight.shape) for m in model.modules() if type(m) is nn.Linear]
    assert int8_weights(model) == len(shapes) > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    kernels = [m.kernel for m in model.modules() if isinstance(m, OpaqueLinear)]
    for kernel, shape in zip(kernels, shapes, strict=True):
        assert isinstance(kernel, Int8)
        assert (kernel.weight.dtype, tuple(kernel.weight.shape)) == (torch.int8, shape)
        assert (kernel.scale.dtype, kernel.scale.numel()) == (dtype, shape[0])
    # The tied head got its own int8 copy; the embedding's lookup table stays in the model's dtype.
    assert model.get_input_embeddings().weight.dtype == dtype
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.dtype == dtype and torch.isfinite(logits).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_weight_quantized_in_blocks_of_rows_is_torchaos_whole(monkeypatch, dtype):
    """A large weight is quantized a block of rows at a time (its temporaries a block's): each
    output channel on its own, the same int8 weights and scales as torchao's on the whole."""
    import torchao.quantization
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    linear = nn.Linear(96, 50).to(dtype)
    whole = nn.Linear(96, 50).to(dtype)
    whole.load_state_dict(linear.state_dict())
    quantize_(whole, Int8WeightOnlyConfig())
    given: list[int] = []
    spy = lambda module, config: given.append(module.weight.shape[0]) or quantize_(module, config)  # noqa: E731
    monkeypatch.setattr(torchao.quantization, "quantize_", spy)
    monkeypatch.setattr(quantized, "ROWS_ELEMENTS", 96 * 7)  # 7 rows at a time
    blocks = Int8.of(linear)
    assert given == [7] * 7 + [1]
    assert torch.equal(blocks.weight, whole.weight.qdata)
    assert torch.equal(blocks.scale, whole.weight.scale.reshape(-1).to(dtype))


def layer(dtype: torch.dtype) -> tuple[Int8, nn.Linear]:
    """An int8 layer, and its float twin carrying exactly the int8 weights times their scales."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 40).to(dtype)
    int8_weights(holder := nn.Sequential(linear))
    kernel = holder[0].kernel
    twin = nn.Linear(96, 40).to(torch.float64)
    with torch.no_grad():
        twin.weight.copy_(kernel.weight.double() * kernel.scale.double()[:, None])
        twin.bias.copy_(kernel.bias.double())
    return kernel, twin


# Both ways sum in float32 and round the outputs to the dtype (bf16: 8 bits): a few of its units.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3 * 2**-8}


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows", [1, 3, 4, 37])
@pytest.mark.parametrize("few_rows", [0, 3, quantized.MOST_ROWS], ids=["converted", "3", "per-row"])
def test_a_few_rows_and_many_rows_compute_the_int8_weights_product(dtype, rows, few_rows):
    kernel, twin = layer(dtype)
    kernel = dataclasses.replace(kernel, few_rows=few_rows)
    x = torch.randn(2, rows, 96).to(dtype)  # a batch of sequences: the rows of both count
    with torch.inference_mode():
        got, exact = kernel(x), twin(x.double())
    assert got.shape == (2, rows, 40) and got.dtype == dtype
    assert (got.double() - exact).abs().max() <= TOLERANCE[dtype] * exact.abs().max()


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=["fp32", "bf16"])
def test_many_rows_multiply_the_weight_converted_a_block_at_a_time(monkeypatch, dtype):
    """A block of the weight converted at a time (kept in the cache): the same product, every block
    in its place, the last one shorter; no conversion of the whole weight."""
    kernel, twin = layer(dtype)
    kernel = dataclasses.replace(kernel, few_rows=0)
    monkeypatch.setattr(quantized, "CONVERT_ELEMENTS", 96 * 7)  # 7 of the 40 output rows a block
    converted = []
    to = torch.Tensor.to
    int8 = lambda t: t.dtype == torch.int8 and converted.append(tuple(t.shape))  # noqa: E731
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *a, **k: int8(t) or to(t, *a, **k))
    x = torch.randn(2, 9, 96).to(dtype)
    with torch.inference_mode():
        got = kernel(x)
    monkeypatch.undo()
    exact = twin(x.double())
    assert converted == [(96, 7)] * 5 + [(96, 5)]  # each block (transposed), never the whole weight
    assert (got.double() - exact).abs().max() <= TOLERANCE[dtype] * exact.abs().max()


def test_each_way_is_taken_on_its_side_of_few_rows(monkeypatch):
    kernel, _ = layer(torch.bfloat16)
    kernel = dataclasses.replace(kernel, few_rows=5)
    calls = []
    int8pack = torch.ops.aten._weight_int8pack_mm
    monkeypatch.setattr(torch.ops.aten, "_weight_int8pack_mm", lambda *a: calls.append(a[0].shape[0]) or int8pack(*a))
    with torch.inference_mode():
        kernel(torch.randn(1, 5, 96, dtype=torch.bfloat16))
        kernel(torch.randn(2, 3, 96, dtype=torch.bfloat16))  # 6 rows
    assert calls == [5]


def synthetic(per_row_us: float, conversion_us: float, converted_row_us: float):
    """Seconds of each way on a CPU where the per-row way costs `per_row_us` a row and converting
    costs `conversion_us` once and `converted_row_us` a row."""
    return lambda rows: (rows * per_row_us * 1e-6, (conversion_us + rows * converted_row_us) * 1e-6)


@pytest.mark.parametrize(
    ("cpu", "expected"),
    [
        # This EPYC's 4864x896 bf16 layer (per row 27 µs, converted 460 + 12 µs a row): they meet near 30.
        (synthetic(27, 460, 12), 16),
        (synthetic(27, 5, 20), 0),  # converting always wins
        (synthetic(1, 460, 1), quantized.MOST_ROWS),  # the per-row way always wins: searched no further
    ],
)
def test_few_rows_is_the_last_power_of_two_where_the_per_row_way_is_no_slower(cpu, expected):
    asked = []
    assert quantized.few_rows(lambda rows: asked.append(rows) or cpu(rows)) == expected
    assert asked == [2**i for i in range(len(asked))] and asked[-1] <= quantized.MOST_ROWS


def test_quantizing_measures_each_layer_shape_once_and_logs_it(monkeypatch, caplog):
    measured = []
    monkeypatch.setattr(quantized, "few_rows", lambda seconds: measured.append(seconds) or 7)
    model = nn.Sequential(nn.Linear(32, 48), nn.Linear(48, 32), nn.Linear(32, 48)).to(torch.bfloat16)
    with caplog.at_level("INFO", logger=quantized.__name__):
        assert int8_weights(model) == 3
    assert len(measured) == 2  # two shapes
    assert [m.kernel.few_rows for m in model] == [7, 7, 7]
    assert "48x32 7, 32x48 7" in caplog.text


def test_quantizing_a_checkpoints_model_lets_its_pages_go(tmp_path):
    """A layer at a time: each float weight's pages leave once its int8 copy exists, so the load
    never holds the file's pages and every int8 weight at once."""
    model, checkpoint, before = read_whole(tmp_path / "lm")
    view = model.model.norm.weight.detach()  # the mapping held, as during the load (test_weights.py)
    int8_weights(model)
    # The linear weights (the tied head, so the embedding's pages too) let go; norms stay.
    assert resident_kb(checkpoint) < before / 10
    del view
