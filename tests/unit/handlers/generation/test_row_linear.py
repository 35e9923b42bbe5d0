"""handlers/generation/row_linear.py (and row_kernels.cpp): the kit's kernels for a few rows give
F.linear's products, a model on them answers as on its plain weights, and a CPU or a machine they do
not suit keeps oneDNN."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from handlers.backends import cpu_flags
from handlers.generation import native, row_linear
from handlers.generation.linears import OpaqueLinear
from handlers.generation.packed_linear import Packed
from handlers.generation.row_linear import NEEDS, Isa, Rows, fits, row_kernels_for, row_linears
from tests.hf_models import qwen2_lm


def on_this_cpu(dtype: torch.dtype, isa: Isa):
    missing = sorted(dict(NEEDS[dtype])[isa] - cpu_flags())
    return pytest.param(
        dtype,
        isa,
        id=f"{str(dtype).removeprefix('torch.')}-{isa.name}",
        marks=pytest.mark.skipif(bool(missing), reason=f"this CPU lacks {missing}"),
    )


# Every kernel this CPU can run, whichever row_kernels_for would choose for it (an AVX-512 CPU runs
# AVX2's too).
KERNELS = [on_this_cpu(dtype, isa) for dtype, choices in NEEDS.items() for isa, _ in choices]


@pytest.fixture
def built():
    """The library, built (once per kernel directory) and loaded, or the test skipped saying why."""
    if native.library() is None:
        pytest.skip("the row kernels could not be built here (the warning above says why)")


def bound(dtype: torch.dtype, exact: torch.Tensor) -> float:
    # float32: another summation order, a few units in the 6th digit. bfloat16: the products are
    # summed in float32 (as oneDNN's are) and the output rounded once to bf16's 8 bits.
    return (1e-5 if dtype == torch.float32 else 2.0**-8) * exact.abs().max().item()


@pytest.mark.parametrize(("dtype", "isa"), KERNELS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 16, 17, 40])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("outputs", [16, 80, 400])  # 1, 5 and 25 blocks of sixteen
@pytest.mark.parametrize("inputs", [96, 40])  # AMX's tiles take 32 at a time: 40 stays on AVX-512
def test_rows_give_f_linears_products(dtype, isa, rows, bias, outputs, inputs, built):
    torch.manual_seed(rows)
    linear = nn.Linear(inputs, outputs, bias=bias).to(dtype)
    x = torch.randn(2, rows, inputs, dtype=dtype)
    got = Rows.of(linear, isa)(x)
    exact = nn.functional.linear(x.float(), linear.weight.float(), None if not bias else linear.bias.float())
    assert got.shape == (2, rows, outputs) and got.dtype == dtype
    assert (got.float() - exact).abs().max().item() <= bound(dtype, exact)


@pytest.mark.parametrize(("dtype", "isa"), KERNELS)
@pytest.mark.parametrize(("rows", "live"), [(2, 1), (6, 1), (6, 4), (16, 9)])
def test_rows_after_the_live_ones_are_zeros_and_the_live_ones_unchanged(dtype, isa, rows, live, built):
    """A decode step's idle rows (runner.py): within native.live_rows the products compute only the
    first rows, the same bits as with every row; after it, every row again, whatever was raised."""
    torch.manual_seed(rows)
    kernel = Rows.of(nn.Linear(64, 400, bias=True).to(dtype), isa)
    x = torch.randn(rows, 1, 64, dtype=dtype)  # a decode step's shape: a token a row
    every = kernel(x)
    with native.live_rows(live):
        some = kernel(x)
    assert torch.equal(some[:live], every[:live])
    assert not some[live:].any()
    with pytest.raises(ValueError, match="raised inside"), native.live_rows(live):
        raise ValueError("raised inside")
    assert torch.equal(kernel(x), every)
    with pytest.raises(RuntimeError, match="a count of rows, not -1"):
        torch.ops.kit_rows.set_live_rows(-1)


@pytest.mark.parametrize(("dtype", "isa"), KERNELS)
@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("outputs", [400, 2096])  # 25 blocks; 131: several pieces a thread, the last short
def test_any_count_of_threads_gives_the_same_bits(dtype, isa, rows, outputs, built):
    """Each output is one sum over the inputs in order, whichever thread, piece and tile width
    computes it: a piece narrower than a tile (many threads, few outputs) changes nothing."""
    torch.manual_seed(0)
    kernel = Rows.of(nn.Linear(64, outputs).to(dtype), isa)
    x = torch.randn(rows, 64, dtype=dtype)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2, 3, 7, 25):
            torch.set_num_threads(count)
            results.append(kernel(x))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(result, results[0]) for result in results)


@pytest.mark.parametrize(("dtype", "isa"), KERNELS)
def test_a_model_on_rows_gives_the_plain_models_logits_eager_and_compiled(dtype, isa, tmp_path, built):
    plain = AutoModelForCausalLM.from_pretrained(qwen2_lm(tmp_path)).eval().to(dtype)
    linears = [m for m in plain.modules() if type(m) is nn.Linear]
    model = copy.deepcopy(plain)
    assert row_linears(model, dtype, isa, Packed.of) == len(linears)
    kernels = [m.kernel for m in model.modules() if isinstance(m, OpaqueLinear)]
    assert sum(isinstance(k, Rows) and k.isa is isa for k in kernels) == sum(fits(m) for m in linears) > 0
    assert all(isinstance(k, Packed) for k in kernels if not isinstance(k, Rows))
    ids = torch.randint(0, plain.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        exact = copy.deepcopy(plain).float()(input_ids=ids).logits
        expected = plain(input_ids=ids).logits.float()
        for run in (lambda m: m(input_ids=ids), lambda m: torch.compile(m.forward, dynamic=True)(input_ids=ids)):
            got = run(model).logits.float()
            # as close to the float32 model as the plain model in this dtype is (bf16: 2 layers'
            # roundings, in another order; a margin of a quarter)
            assert (got - exact).abs().max() <= max(1.25 * (expected - exact).abs().max(), bound(dtype, exact))
            assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_shapes_the_kernels_do_not_take_are_not_theirs():
    assert fits(nn.Linear(64, 32))
    assert not fits(nn.Linear(64, 24))  # outputs not in blocks of 16
    assert fits(nn.Linear(63, 32))  # float32 takes inputs one at a time
    assert not fits(nn.Linear(63, 32).to(torch.bfloat16))  # bf16 in pairs


@pytest.mark.parametrize(
    ("flags", "dtype", "expected"),
    [
        ({"avx2", "fma", "avx512f", "avx512bw", "avx512_bf16"}, torch.bfloat16, Isa.AVX512),
        ({"avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"}, torch.bfloat16, Isa.AMX),
        ({"avx512f", "avx512bw", "avx512_bf16", "amx_bf16"}, torch.bfloat16, Isa.AVX512),  # no tiles
        ({"avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16"}, torch.float32, Isa.AVX512),
        ({"avx2", "fma"}, torch.float32, Isa.AVX2),  # EPYCs before Zen 4
        ({"avx2", "fma"}, torch.bfloat16, None),
        ({"avx2"}, torch.float32, None),  # no FMA
        ({"avx512f", "avx512bw"}, torch.bfloat16, None),
        ({"avx512f"}, torch.float16, None),
    ],
)
def test_which_cpus_take_the_kernels(flags, dtype, expected, monkeypatch):
    monkeypatch.setattr(row_linear, "library", lambda: "loaded")
    monkeypatch.setattr(row_linear, "granted", lambda isa: True)
    assert row_kernels_for(dtype, frozenset(flags)) is expected


def test_amx_refused_by_linux_serves_bf16_on_avx512_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(row_linear, "library", lambda: "loaded")
    monkeypatch.setattr(torch.ops.kit_rows, "tiles_permitted", lambda: False, raising=False)
    amx = frozenset({"avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"})
    with caplog.at_level(logging.WARNING, logger=row_linear.__name__):
        assert row_kernels_for(torch.bfloat16, amx) is Isa.AVX512
    assert "refused this process its tiles" in caplog.text


def test_linux_grants_the_tiles_exactly_where_the_cpu_has_them(built):
    # arch_prctl(ARCH_REQ_XCOMP_PERM) is refused where the CPU has no AMX (Linux 5.16+ on x86-64)
    assert torch.ops.kit_rows.tiles_permitted() == ("amx_tile" in cpu_flags())


def test_a_kernel_asked_of_an_instruction_set_it_lacks_is_refused_by_name(built):
    linear = nn.Linear(32, 16).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="no kernel for instruction set 2 in BFloat16"):
        Rows.of(linear, Isa.AVX2)(torch.randn(1, 32, dtype=torch.bfloat16))


@pytest.mark.parametrize(("dtype", "isa"), KERNELS)
def test_a_compiled_model_calls_its_held_layers_in_the_library_without_python(dtype, isa, monkeypatch, built):
    """Each layer on the kit's kernels is held by the library under its key: the graph's call gives
    its kernel's bits, is counted in keyed_seconds, and never reaches the kernel's Python."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 32, bias=False)).to(dtype)
    row_linears(model, dtype, isa, Packed.of)
    layers = [m for m in model if isinstance(m, OpaqueLinear)]
    assert [m.op for m in layers] == [torch.ops.kit_rows.keyed_linear.default] * 2
    # Every nn.Sequential shares one forward code object, whose compiled entries Dynamo caps at 8
    # per process: the other parameters' models (and other tests' in this worker) count otherwise.
    torch._dynamo.reset()
    compiled = torch.compile(model, dynamic=True, fullgraph=True)
    for rows in (1, 2, 16):
        x = torch.randn(rows, 64, dtype=dtype)
        expected = layers[1].kernel(model[1](layers[0].kernel(x)))  # each kernel called through Python
        with monkeypatch.context() as patched:
            patched.setattr(Rows, "__call__", lambda self, x: pytest.fail("a held layer was computed in Python"))
            before = torch.ops.kit_rows.keyed_seconds()
            got = compiled(x)
            assert torch.ops.kit_rows.keyed_seconds() > before
        assert torch.equal(got, expected)


def test_a_key_the_library_does_not_hold_is_refused_by_name(built):
    with pytest.raises(RuntimeError, match="no layer held under key 123456789"):
        torch.ops.kit_rows.keyed_linear(torch.randn(1, 32), 123456789)
    with pytest.raises(RuntimeError, match="a key is not negative, not -1"):
        torch.ops.kit_rows.hold(-1, torch.randn(1, 32, 16), None, Isa.AVX512.value)
