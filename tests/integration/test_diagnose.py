"""make doctor / make profile in this process (no server): on a deliberately broken compiler,
and on the real archives (`make archive` builds them; `make test` does)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from diagnose.__main__ import main as diagnose_main
from diagnose.doctor import diagnose
from handlers.settings import ImageSettings
from handlers.typed_config import parse_settings


class PointwiseNet(torch.nn.Module):
    """relu in a generated C++ kernel, where Inductor's fault injection lands."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + torch.sin(x)


def test_doctor_names_inductor_and_writes_a_repro_that_fails(tmp_path):
    settings = parse_settings(ImageSettings, {"channels_last": False})
    # A broken lowering: Inductor's test hook makes its C++ relu compute a wrong value. It is a
    # config value, so the minifier's child processes inherit it (a monkeypatch would not).
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}):
        diagnosis = diagnose("pointwise", PointwiseNet(), (torch.randn(2, 3, 8, 8),), settings, tmp_path)
    stages = {r.stage: r for r in diagnosis.stages}
    assert stages["Dynamo"].passed and stages["AOT Autograd"].passed
    assert not stages["Inductor"].passed and stages["Inductor"].accuracy_error > diagnosis.tolerance == 1e-3
    assert diagnosis.culprit == "Inductor"
    assert "culprit: Inductor" in (tmp_path / "diagnosis.txt").read_text()
    assert diagnosis.repro and (tmp_path / "repro.py").is_file()
    # The minified repro reproduces the wrong result on its own.
    run = subprocess.run([sys.executable, diagnosis.repro], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert run.returncode != 0 and "Bad accuracy detected" in run.stderr, run.stderr[-2000:]


def test_doctor_names_a_compile_error_without_minifying(tmp_path):
    settings = parse_settings(ImageSettings, {"channels_last": False})
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}):
        diagnosis = diagnose(
            "pointwise", PointwiseNet(), (torch.randn(2, 3, 8, 8),), settings, tmp_path, minify_on_failure=False
        )
    assert diagnosis.culprit == "Inductor"
    assert diagnosis.stages[-1].error and diagnosis.stages[-1].accuracy_error is None
    assert diagnosis.repro is None


# MiniLM stands for the text models: BERT-base's graphs (12 layers) took twice its CPU time here.
@pytest.mark.parametrize("model", ["resnet50", "minilm"])
def test_doctor_passes_the_served_models(model, monkeypatch, tmp_path):
    monkeypatch.setattr("diagnose.__main__.LOGS", tmp_path)
    assert diagnose_main(["doctor", "--model", model]) == 0
    (report,) = tmp_path.glob(f"doctor/{model}-*/diagnosis.json")
    stages = json.loads(report.read_text())["stages"]
    assert [s["stage"] for s in stages] == ["Dynamo", "AOT Autograd", "Inductor"]
    assert all(s["passed"] for s in stages)


# A text model's frozen float32 linears run oneDNN's packed product on any CPU (linear_kernel: auto
# picks MKL on Intel): its lengths vary, so a linear's rows are a symbol, and Inductor packs for
# MKL only a fixed number of rows (torch 2.13's fx_passes/mkldnn_fusion.py).
@pytest.mark.parametrize(
    ("model", "compiled_op"), [("resnet50", "mkldnn::_convolution_pointwise"), ("minilm", "mkldnn::_linear_pointwise")]
)
def test_profile_writes_tables_traces_and_summary(model, compiled_op, monkeypatch, tmp_path):
    monkeypatch.setattr("diagnose.__main__.LOGS", tmp_path)
    assert diagnose_main(["profile", "--model", model]) == 0
    (run,) = tmp_path.glob(f"profile/{model}-*")
    for name in ("eager_top20.txt", "inductor_top20.txt", "comparison.md", "tma.txt", "summary.txt"):
        assert (run / name).is_file(), name
    trace = json.loads((run / "inductor_trace.json").read_text())["traceEvents"]
    names = {event.get("name", "") for event in trace}
    # Frozen weights: the compiled model calls the prepacked oneDNN/MKL kernels, and Inductor's
    # own C++ kernels are named in the trace (enable_kernel_profile).
    assert compiled_op in names
    assert any("cpp_fused" in name for name in names)
    assert "x)" in (run / "summary.txt").read_text()  # the speedup figure
