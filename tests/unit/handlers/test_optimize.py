"""Each backend against eager on tiny models, at explicit tolerances; failure and fallback paths."""

import logging
import time
from pathlib import Path

import pytest
import torch

from handlers import backends
from handlers.accuracy import (
    TOLERANCES,
    AccuracyError,
    Answer,
    Reference,
    cosine_distance,
    probability_errors,
    require_accuracy,
)
from handlers.architectures.text import BertClassifier
from handlers.backends import Backend, DType
from handlers.backends.common import BackendUnavailable, CompileError
from handlers.optimize import optimize
from handlers.settings import ImageSettings, TextSettings
from handlers.text_classification import text_example
from handlers.typed_config import SettingsError, parse_settings

# Inductor reorders float reductions (and folds BN into conv under freezing): fp32 agrees to ~1e-5.
FP32_TOL = {"rtol": 1e-4, "atol": 1e-4}
# bfloat16 keeps 8 mantissa bits: ~1e-2 relative on logits of this size.
BF16_TOL = {"rtol": 5e-2, "atol": 5e-2}


def eager_reference(model, inputs):
    with torch.inference_mode():
        return model(*inputs).float()


def run(optimized, inputs):
    with torch.inference_mode():
        return optimized(*inputs)


@pytest.mark.parametrize(
    ("overrides", "tolerance"),
    [
        # channels-last picks other oneDNN conv kernels: same math, different summation order.
        ({"backend": "eager"}, {"rtol": 1e-5, "atol": 1e-6}),
        ({"backend": "inductor"}, FP32_TOL),
        ({"backend": "inductor", "channels_last": False}, FP32_TOL),
        ({"backend": "inductor", "dtype": "bfloat16"}, BF16_TOL),
    ],
    ids=["eager", "inductor-channels-last", "inductor-nchw", "inductor-bf16"],
)
def test_image_backends_match_eager(tiny_cnn, overrides, tolerance, monkeypatch):
    # The math of bf16 is checked on any CPU; the refusal of a CPU without bf16 is tested below.
    monkeypatch.setattr(backends, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    settings = parse_settings(ImageSettings, overrides)
    examples = [(torch.randn(1, 3, 32, 32),), (torch.randn(4, 3, 32, 32),)]
    references = [eager_reference(tiny_cnn, x) for x in examples]
    optimized = optimize(tiny_cnn, settings, examples)
    assert optimized.backend is settings.backend
    for inputs, reference in zip(examples, references, strict=True):
        torch.testing.assert_close(run(optimized, inputs), reference, **tolerance)


@pytest.mark.parametrize("backend", ["inductor", "eager", "ipex"])
def test_bf16_is_refused_on_a_cpu_without_bf16_with_the_reason(tiny_cnn, monkeypatch, backend):
    monkeypatch.setattr(backends, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_vnni", "amx_tile"}))
    settings = parse_settings(ImageSettings, {"backend": backend, "dtype": "bfloat16", "fallback_to_eager": True})
    with pytest.raises(
        BackendUnavailable, match="dtype bfloat16 needs a CPU with AMX_BF16 or AVX512_BF16; this one has neither"
    ):
        optimize(tiny_cnn, settings, [(torch.randn(1, 3, 32, 32),)])


def test_text_inductor_matches_eager_with_padding(tiny_bert_config):
    torch.manual_seed(0)
    model = BertClassifier(tiny_bert_config).eval()
    examples = [text_example(2, 32, 100)]
    reference = eager_reference(model, examples[0])
    optimized = optimize(model, parse_settings(TextSettings, {"backend": "inductor"}), examples)
    torch.testing.assert_close(run(optimized, examples[0]), reference, **FP32_TOL)
    # A different padding pattern through the same compiled graph: padding must not be baked in.
    ids, mask, types = text_example(2, 32, 100)
    mask[0, 5:] = 0
    torch.testing.assert_close(
        run(optimized, (ids, mask, types)), eager_reference(model, (ids, mask, types)), **FP32_TOL
    )


@pytest.mark.parametrize("channels_last", [True, False])
def test_serving_calls_reuse_the_warmed_up_graph(tiny_cnn, channels_last):
    from torch._dynamo.utils import counters

    settings = parse_settings(ImageSettings, {"backend": "inductor", "channels_last": channels_last})
    optimized = optimize(tiny_cnn, settings, [(torch.randn(2, 3, 32, 32),)])
    graphs = counters["stats"]["unique_graphs"]
    run(optimized, (torch.randn(2, 3, 32, 32),))  # a request as the handler collates it: NCHW
    assert counters["stats"]["unique_graphs"] == graphs, "the first request recompiled"


def test_inductor_really_freezes_the_weights(tiny_cnn):
    # Frozen: BN folded into the conv, which runs as oneDNN's prepacked kernel. Unfrozen Inductor
    # still calls aten's convolution and computes batch norm in a generated kernel.
    x = (torch.randn(1, 3, 32, 32),)
    torch._dynamo.reset()
    with torch._inductor.config.patch(freezing=False):  # optimize itself must turn it on
        optimized = optimize(tiny_cnn, parse_settings(ImageSettings, {"backend": "inductor"}), [x])
    with torch.profiler.profile() as profile, torch.inference_mode():
        optimized(*x)
    names = {event.key for event in profile.key_averages()}
    assert any("mkldnn::_convolution_pointwise" in name for name in names), sorted(names)
    assert not any("batch_norm" in name or name == "aten::convolution" for name in names), sorted(names)


def use_backend(monkeypatch, build) -> None:
    """Every backend builds with `build(model, settings, spec)` (the registry's lookup, replaced)."""
    monkeypatch.setattr("handlers.optimize.builder", lambda backend: build)


def slow_first_call_backend(model, settings, spec):
    calls = []

    def run(*inputs):
        calls.append(1)
        if len(calls) == 1:  # the compiling call of the only warm-up shape
            time.sleep(0.5)
        return model(*inputs)

    return run


def test_compile_time_is_reported_apart_from_warmup(tiny_cnn, monkeypatch):
    use_backend(monkeypatch, slow_first_call_backend)
    settings = parse_settings(ImageSettings, {"backend": "inductor", "warmup_iterations": 3})
    optimized = optimize(tiny_cnn, settings, [(torch.randn(1, 3, 32, 32),)])
    assert optimized.compile_seconds >= 0.5  # the first call per shape
    assert optimized.warmup_seconds < 0.25  # the three steady calls after it


def broken_backend(model, settings, spec):
    def run(*inputs):
        raise RuntimeError("lowering failed: aten.fake_op\nlong traceback here")

    return run


def test_compile_failure_is_loud_by_default(tiny_cnn, monkeypatch):
    use_backend(monkeypatch, broken_backend)
    with pytest.raises(CompileError, match=r"'inductor' failed during warm-up \(RuntimeError: lowering failed"):
        optimize(tiny_cnn, parse_settings(ImageSettings, {}), [(torch.randn(1, 3, 32, 32),)])


def test_fallback_to_eager_only_when_configured(tiny_cnn, monkeypatch, caplog):
    use_backend(monkeypatch, broken_backend)
    settings = parse_settings(ImageSettings, {"fallback_to_eager": True})
    x = (torch.randn(1, 3, 32, 32),)
    reference = eager_reference(tiny_cnn, x)
    with caplog.at_level(logging.WARNING):
        optimized = optimize(tiny_cnn, settings, [x])
    assert optimized.backend is Backend.EAGER and optimized.accuracy_error is None
    assert "lowering failed: aten.fake_op" in optimized.fallback_reason
    assert "falling back to eager" in caplog.text and "lowering failed" in caplog.text
    torch.testing.assert_close(run(optimized, x), reference, rtol=1e-5, atol=1e-6)


class PointwiseNet(torch.nn.Module):
    """relu in a generated C++ kernel (not a oneDNN post-op), where Inductor's test bug lands."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + torch.sin(x)


@pytest.fixture
def broken_relu_lowering():
    # Inductor's own fault injection: its C++ relu computes a wrong value.
    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}):
        yield
    torch._dynamo.reset()


def test_wrong_compiled_output_stops_the_worker(broken_relu_lowering):
    settings = parse_settings(ImageSettings, {"channels_last": False})
    with pytest.raises(
        AccuracyError,
        match=r"'inductor' answers differently from eager on \d+ of 2 check inputs: worst \S+ "
        r"\(\|\|out - ref\|\| / \|\|ref\|\| per answer; tolerance 0.001\); run `make doctor`",
    ):
        optimize(PointwiseNet(), settings, [(torch.randn(2, 3, 8, 8),)])


def test_values_are_judged_by_scale_as_well_as_direction():
    """Issue 39's case: an answer a quarter too small in every entry points the same way (cosine 1)
    and is wrong; rounding noise of 1 % of a row is not."""
    expected = torch.randn(4, 3) * 5
    reference = Reference([(torch.zeros(1),)], [expected])
    int8 = TOLERANCES[(DType.INT8, Answer.VALUES)]
    noisy = expected + 0.01 * expected.norm(dim=1, keepdim=True) * torch.nn.functional.normalize(
        torch.randn(4, 3), dim=1
    )
    assert require_accuracy(lambda x: noisy, reference, "openvino", Answer.VALUES, int8) == pytest.approx(
        0.01, rel=1e-3
    )
    shrunk = 0.74 * expected
    assert cosine_distance(shrunk, expected) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(AccuracyError, match=r"on 4 of 4 check inputs: worst 0.26 .*tolerance 0.2\)"):
        require_accuracy(lambda x: shrunk, reference, "openvino", Answer.VALUES, int8)


def test_probabilities_are_judged_by_their_difference_and_a_clear_top1_flip():
    """A classifier's client sees probabilities: a flip between classes eager calls tied passes,
    a flip past a clear margin or probabilities off by more than the tolerance fails."""
    limit = TOLERANCES[(DType.INT8, Answer.PROBABILITIES)]
    tied = torch.tensor([[2.0, 2.0 - 1e-3, -1.0]])  # eager: 0.488 vs 0.487
    flipped_tie = torch.tensor([[2.0 - 1e-3, 2.0, -1.0]])
    assert probability_errors(flipped_tie, tied).item() < 1e-3
    clear = torch.tensor([[3.0, 2.0, -1.0]])  # eager: 0.72 vs 0.26
    swapped = torch.tensor([[2.0, 3.0, -1.0]])
    assert probability_errors(swapped, clear).item() == pytest.approx(0.72 - 0.26, abs=0.01)
    reference = Reference([(torch.zeros(1),)], [clear])
    with pytest.raises(
        AccuracyError, match=r"on 1 of 1 check inputs: worst 0.45\d \(largest difference of a class probability"
    ):
        require_accuracy(lambda x: swapped, reference, "aoti", Answer.PROBABILITIES, limit)
    colder = clear * 2  # the same ranking, sharper probabilities: 0.88 for 0.72
    with pytest.raises(AccuracyError, match="worst 0.159"):
        require_accuracy(lambda x: colder, reference, "aoti", Answer.PROBABILITIES, limit)
    assert require_accuracy(lambda x: clear * 1.05, reference, "aoti", Answer.PROBABILITIES, limit) < limit


def test_wrong_compiled_output_falls_back_when_configured(broken_relu_lowering, caplog):
    settings = parse_settings(ImageSettings, {"channels_last": False, "fallback_to_eager": True})
    x = (torch.randn(2, 3, 8, 8),)
    with caplog.at_level(logging.WARNING):
        optimized = optimize(PointwiseNet(), settings, [x])
    assert optimized.backend is Backend.EAGER
    assert "answers differently from eager" in optimized.fallback_reason
    assert "answers differently from eager" in caplog.text
    torch.testing.assert_close(run(optimized, x), PointwiseNet()(*x))


def test_correct_compile_reports_its_small_error(tiny_cnn):
    optimized = optimize(tiny_cnn, parse_settings(ImageSettings, {}), [(torch.randn(2, 3, 32, 32),)])
    assert optimized.accuracy_error is not None and optimized.accuracy_error < 1e-4
    # Eager is the reference itself: no guard runs.
    assert (
        optimize(
            tiny_cnn, parse_settings(ImageSettings, {"backend": "eager"}), [(torch.randn(1, 3, 8, 8),)]
        ).accuracy_error
        is None
    )


def test_the_guard_measures_the_difference_to_eager(tiny_cnn, monkeypatch):
    def offset_backend(model, settings, spec):
        return lambda *inputs: model(*inputs) + 1e-4  # every logit off by 1e-4

    use_backend(monkeypatch, offset_backend)
    x = (torch.randn(2, 3, 32, 32),)
    with torch.inference_mode():
        logits = tiny_cnn(*x)
    # Each row off by 1e-4 in all of its entries: ||1e-4|| / ||row||, the worst row's.
    expected = (1e-4 * logits.shape[1] ** 0.5 / logits.norm(dim=1)).max().item()
    optimized = optimize(tiny_cnn, parse_settings(ImageSettings, {}), [x])
    assert optimized.accuracy_error == pytest.approx(expected, rel=1e-2)


def test_ipex_compile_serves_float32_only_and_says_so_when_parsed():
    assert parse_settings(ImageSettings, {"backend": "ipex", "dtype": "bfloat16"}).dtype is DType.BFLOAT16
    with pytest.raises(
        SettingsError, match="backend 'ipex-compile' does not serve dtype 'bfloat16' .it serves float32."
    ):
        parse_settings(ImageSettings, {"backend": "ipex-compile", "dtype": "bfloat16"})


@pytest.mark.parametrize("backend", ["ipex", "ipex-compile"])
def test_ipex_in_main_env_says_how_to_get_it(tiny_cnn, backend):
    settings = parse_settings(ImageSettings, {"backend": backend, "fallback_to_eager": True})
    # Never silently eager: a missing environment is a configuration error even with fallback on.
    with pytest.raises(BackendUnavailable, match="make install-ipex"):
        optimize(tiny_cnn, settings, [(torch.randn(1, 3, 32, 32),)])


class TwoLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(64, 128), torch.nn.Linear(128, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


@pytest.mark.parametrize(("kernel", "op"), [("mkl", "mkl::_mkl_linear"), ("onednn", "mkldnn::_linear_pointwise")])
def test_frozen_linears_run_the_chosen_library(kernel, op):
    torch.manual_seed(0)
    model, x = TwoLinears().eval(), (torch.randn(8, 64),)
    torch._dynamo.reset()
    optimized = optimize(model, parse_settings(TextSettings, {"linear_kernel": kernel}), [x])
    with torch.profiler.profile() as profile, torch.inference_mode():
        output = optimized(*x)
    names = {event.key for event in profile.key_averages()}
    assert op in names, sorted(names)
    assert not {"mkl::_mkl_linear", "mkldnn::_linear_pointwise"} - {op} & names, sorted(names)
    torch.testing.assert_close(output, eager_reference(model, x), **FP32_TOL)


@pytest.mark.parametrize(("vendor", "kernel"), [("GenuineIntel", "mkl"), ("AuthenticAMD", "onednn"), ("", "onednn")])
def test_auto_linear_kernel_follows_the_cpu_vendor(tmp_path, vendor, kernel):
    from handlers.backends.inductor import cpu_vendor, linear_kernel
    from handlers.settings import LinearKernel

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\nmodel name\t: x\n" if vendor else "processor\t: 0\n")
    assert linear_kernel(LinearKernel.AUTO, cpu_vendor(cpuinfo)) == kernel
    assert linear_kernel(LinearKernel.MKL, cpu_vendor(cpuinfo)) == "mkl"  # an explicit choice wins


def test_inductors_precompiled_header_is_kept_where_the_next_start_finds_it(tmp_path, monkeypatch):
    """torch keeps it under the temporary directory, a server's own and deleted at its stop: every
    start compiled it again (8.9 s of a 29 s language model start). The kit's compile cache keeps
    it; a build leaves its header where HEADERS_VAR says (the kit's cache, for its workers)."""
    from torch._inductor import codecache

    from handlers.backends.inductor import HEADERS, HEADERS_VAR, headers_in_cache

    for name in ("_HEADER_DIR", "_HEADER_LOCK_DIR"):  # restored after the test
        monkeypatch.setattr(codecache, name, getattr(codecache, name))
        assert name in codecache._precompile_header.__wrapped__.__code__.co_names  # read when one compiles
    monkeypatch.delenv(HEADERS_VAR, raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))

    def where() -> tuple[Path, Path]:
        headers_in_cache()
        return Path(codecache._HEADER_DIR), Path(codecache._HEADER_LOCK_DIR)

    assert where() == (tmp_path / "cache" / HEADERS, tmp_path / "cache" / HEADERS / "locks")
    monkeypatch.setenv(HEADERS_VAR, str(tmp_path / "kit-cache" / HEADERS))
    assert where()[0] == tmp_path / "kit-cache" / HEADERS
