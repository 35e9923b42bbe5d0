"""A language model for OpenVINO GenAI: the environment that exports it, and the export.

    python()                                     # .cache/openvino-genai/venv/bin/python, made first if needed
    export(model_dir, out, IrWeights.FLOAT16, say=log)  # out/openvino_model.xml and the tokenizer's models
    ir_weights("bfloat16", int8=False)            # IrWeights.FLOAT16: what a precision is served from

The exporter (optimum-intel) needs an older transformers than the kit's, so it runs in an
environment of its own, .cache/openvino-genai/venv (requirements/openvino-genai.txt), made on
first use in a minute or two: `make archive` of a language model's openvino variant, and the
bench's OpenVINO GenAI peer, which also serves from it. The kit's worker needs only the pipeline
(openvino-genai, in .venv): the export is the archive's.

The environment is layered on the kit's: a .pth file puts the kit's site-packages after its own,
so torch, OpenVINO and the rest the kit already has are found there and not installed twice
(1.6 GB apart, 0.15 GB layered: a fresh CI machine's disk is what ran out), while its own older
transformers, first on the path, shadows the kit's.
"""

from __future__ import annotations

import enum
import hashlib
import shutil
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

from kit.long_step import run
from kit.paths import ROOT

HOME = ROOT / ".cache" / "openvino-genai"
VENV = HOME / "venv"
PYTHON = VENV / "bin" / "python"
REQUIREMENTS = ROOT / "requirements" / "openvino-genai.txt"
STAMP = VENV / ".installed"
# In the environment's site-packages: the kit's site-packages, searched after the environment's own.
LAYER = "kit-environment.pth"
# PyPI's torchvision arrives with optimum-intel and fails to import beside the local torch 2.13
# wheel ("operator torchvision::nms does not exist"), which breaks transformers' imports: removed.
UNUSABLE = ("torchvision",)


class IrWeights(enum.StrEnum):
    """How an exported IR stores its weights (model_store/openvino_lm_export.py --weights)."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    INT8 = "int8"  # the linear layers' (one scale per output channel)


# The IR a precision is computed from, its weights not compressed. bfloat16 from float16: the CPU
# plugin packs a bf16 copy of whatever the IR holds and the IR's pages stay mapped beside it, so
# float16 halves them and the archive (Qwen2.5-0.5B's shape served: 2.4 GiB resident in run F of
# docs/generation.md, 3.4 from float32 in run E); the accuracy guard judges what it serves.
IR_WEIGHTS = {"float32": IrWeights.FLOAT32, "bfloat16": IrWeights.FLOAT16}


def ir_weights(dtype: str, int8: bool) -> IrWeights:
    """The IR's weights for a model computed in `dtype` (on int8 weights or not)."""
    return IrWeights.INT8 if int8 else IR_WEIGHTS[dtype]


def log(message: str) -> None:
    print(f"[openvino-genai] {message}", flush=True)


def python(say: Callable[[str], None] = log) -> Path:
    """The environment's python, making the environment first if its requirements changed."""
    kit_packages = sysconfig.get_paths()["purelib"]
    digest = hashlib.sha256(REQUIREMENTS.read_bytes() + kit_packages.encode()).hexdigest()
    if STAMP.is_file() and STAMP.read_text() == digest:
        return PYTHON
    # Made anew: what an earlier environment installed itself would otherwise shadow the kit's.
    shutil.rmtree(VENV, ignore_errors=True)
    HOME.mkdir(parents=True, exist_ok=True)
    # From the kit's python: venv bases the new environment on the interpreter beneath it.
    run([sys.executable, "-m", "venv", str(VENV)], f"creating {VENV}", HOME / "venv.log", say)
    own_packages = Path(sysconfig.get_paths(vars={"base": str(VENV), "platbase": str(VENV)})["purelib"])
    (own_packages / LAYER).write_text(kit_packages + "\n")
    pip = [str(PYTHON), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)]
    run(pip, "installing optimum-intel and what the kit's environment lacks", HOME / "pip.log", say)
    run(
        [str(PYTHON), "-m", "pip", "uninstall", "-y", *UNUSABLE],
        "removing torchvision",
        HOME / "pip-uninstall.log",
        say,
    )
    STAMP.write_text(digest)
    return PYTHON


def export(model_dir: Path, out: Path, weights: IrWeights, say: Callable[[str], None] = log, name: str = "") -> Path:
    """`model_dir` exported into `out` with its weights stored as `weights`; `out`. Its log is
    named after `name` (the model directory's, by default)."""
    command = [str(python(say)), "-m", "model_store.openvino_lm_export", str(model_dir), str(out), "--weights", weights]
    out.mkdir(parents=True, exist_ok=True)
    log_file = HOME / f"export-{name or model_dir.name}-{weights}.log"
    run(command, f"exporting {model_dir} to OpenVINO ({weights} weights)", log_file, say, cwd=ROOT)
    return out
