"""What the bench's peers make from a model before serving it (a build, an environment, a GGUF
file, an OpenVINO export): long steps run with their output in a log file, their time printed and
the log's end shown when one fails (kit/long_step.py), and what they make kept under
.cache/peers/, named after the model directory's files so that a re-saved model is converted again.

    run(["cmake", ...], "building llama-server", build / "build.log", say=log)
    derived(model_dir, version) + "-bf16.gguf"
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kit.long_step import run as run  # the peers' long steps
from kit.paths import ROOT

PEERS = ROOT / ".cache" / "peers"


def derived(model_dir: Path, version: str) -> str:
    """A name for what a peer of `version` makes of `model_dir`: its name and a digest of its
    files, their sizes and times."""
    stamp = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in model_dir.iterdir() if p.is_file())
    digest = hashlib.sha256(f"{model_dir.resolve()} {stamp} {version}".encode()).hexdigest()[:12]
    return f"{model_dir.name}-{digest}"
