"""Intel Extension for PyTorch; its backends run only in the IPEX environment (.venv-ipex).

    run = build_traced(model, settings, spec)     # ipex.optimize -> jit.trace -> jit.freeze
    run = build_compiled(model, settings, spec)   # torch.compile(backend="ipex")

IPEX 2.8 is the last release and only imports with torch 2.8.x; on a mismatch its import
raises an unrelated AttributeError. So installed versions are compared *before* importing.
The traced one also serves bfloat16, where the CPU computes it (checked before any backend is
built); the compiled one serves float32 only (the registry's dtypes, checked when parsed).
"""

from __future__ import annotations

from importlib import metadata

import torch
from torch import nn

from handlers.backends.common import AUTOCAST_DTYPES, BackendUnavailable, BuildSpec, Runner
from handlers.settings import OptimizationSettings

HOW_TO_FIX = "run `make install-ipex` and serve with `make serve VARIANT=ipex` (uses .venv-ipex)"


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


def build_traced(model: nn.Module, settings: OptimizationSettings, spec: BuildSpec) -> Runner:
    """ipex.optimize (weight prepacking, fusions) -> TorchScript trace -> freeze. For bfloat16,
    ipex.optimize prepacks bf16 weights and `model` is prepare()'s autocast wrapper, so the trace
    records the casts: IPEX's own recipe, tracing under autocast."""
    require_ipex()
    import intel_extension_for_pytorch as ipex

    dtype = AUTOCAST_DTYPES.get(settings.dtype, torch.float32)
    with torch.no_grad():
        # Without sample_input, ipex.optimize re-lays out weights on every call: half of eager speed.
        optimized = ipex.optimize(model.eval(), dtype=dtype, sample_input=spec.example)
        traced = torch.jit.trace(optimized, spec.example, check_trace=False, strict=False)
        return torch.jit.freeze(traced)


def build_compiled(model: nn.Module, settings: OptimizationSettings, spec: BuildSpec) -> Runner:
    """torch.compile with IPEX's Dynamo backend (measured slower than plain Inductor here)."""
    require_ipex()
    import intel_extension_for_pytorch  # noqa: F401 - registers the "ipex" Dynamo backend

    return torch.compile(model, backend="ipex", dynamic=False)
