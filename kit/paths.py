"""Where the kit's files live, and what every process it starts gets in its environment.

from kit.paths import ROOT, STORE
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config"
STORE = ROOT / "model_store"  # model_store/<variant>/<model>/, an archive each
LOGS = ROOT / "logs"
# Compiled C++ kernels, shared by every server, bench child and test: restarts reuse them (frozen
# graphs bypass the FX-graph cache, so a restart still lowers the graph: docs/backends.md).
INDUCTOR_CACHE = ROOT / ".cache" / "inductor"
# The kit's own compiled kernels (handlers/generation/native.py), built once for every process.
KERNELS = ROOT / ".cache" / "kernels"
KERNELS_VAR = "KIT_KERNELS_DIR"  # native.KERNELS_VAR: named here too, this module imports no torch

# Nothing the kit starts may reach a model hub: weights ship in archives and pip packages.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def process_environment(environ: dict[str, str]) -> dict[str, str]:
    """`environ` plus what a server, worker, archive build or bench child of the kit needs."""
    kernels = environ.get(KERNELS_VAR) or str(KERNELS)  # the image's own, built into it (Containerfile)
    return {**environ, **OFFLINE, "TORCHINDUCTOR_CACHE_DIR": str(INDUCTOR_CACHE), KERNELS_VAR: kernels}
