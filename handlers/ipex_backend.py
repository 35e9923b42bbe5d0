"""Intel Extension for PyTorch backends; they run only in the IPEX environment (.venv-ipex).

    run = trace_with_ipex(model, settings, example)   # ipex.optimize -> jit.trace -> jit.freeze

IPEX 2.8 is the last release and only imports with torch 2.8.x; on a mismatch its import
raises an unrelated AttributeError. So installed versions are compared *before* importing.
"""

from __future__ import annotations

from importlib import metadata

import torch
from torch import nn

from handlers.optimize import BackendUnavailable, Inputs, Runner
from handlers.settings import DType, OptimizationSettings

HOW_TO_FIX = "run `make install-ipex` and serve with `make serve BACKEND=ipex` (uses .venv-ipex)"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def require_ipex() -> None:
    ipex_version = _version("intel-extension-for-pytorch")
    torch_version = _version("torch") or "?"
    if ipex_version is None:
        raise BackendUnavailable(f"backend 'ipex' needs intel-extension-for-pytorch, not installed here; {HOW_TO_FIX}")
    if ipex_version.split(".")[:2] != torch_version.split("+")[0].split(".")[:2]:
        raise BackendUnavailable(
            f"intel-extension-for-pytorch {ipex_version} does not match torch {torch_version} "
            f"(IPEX needs the same major.minor); {HOW_TO_FIX}"
        )


def _require_float32(settings: OptimizationSettings) -> None:
    # Without AMX, IPEX's bf16/int8 paths bring nothing here; the kit keeps IPEX to float32.
    if settings.dtype is not DType.FLOAT32:
        raise BackendUnavailable(f"the ipex backends serve float32 only, got dtype {settings.dtype.value!r}")


def trace_with_ipex(model: nn.Module, settings: OptimizationSettings, example: Inputs) -> Runner:
    """ipex.optimize (weight prepacking, fusions) -> TorchScript trace -> freeze."""
    require_ipex()
    _require_float32(settings)
    import intel_extension_for_pytorch as ipex

    with torch.no_grad():
        # Without sample_input, ipex.optimize re-lays out weights on every call: half of eager speed.
        optimized = ipex.optimize(model.eval(), dtype=torch.float32, sample_input=example)
        traced = torch.jit.trace(optimized, example, check_trace=False, strict=False)
        return torch.jit.freeze(traced)


def compile_with_ipex_backend(model: nn.Module, settings: OptimizationSettings) -> Runner:
    """torch.compile with IPEX's Dynamo backend (measured slower than plain Inductor here)."""
    require_ipex()
    _require_float32(settings)
    import intel_extension_for_pytorch  # noqa: F401 - registers the "ipex" Dynamo backend

    return torch.compile(model, backend="ipex", dynamic=False)
