"""Guard for Intel Extension for PyTorch, which lives in its own environment (.venv-ipex).

IPEX 2.8 is the last release and only imports with torch 2.8.x; on a mismatch its import
raises an unrelated AttributeError. So compare installed versions *before* importing.
"""

from __future__ import annotations

from importlib import metadata

from handlers.optimize import BackendUnavailable

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
