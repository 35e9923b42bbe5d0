"""OpenVINO GenAI's continuous-batching pipeline as a peer of PLAN=generate, on the same weights.

    .venv/bin/python -m bench.openvino_genai setup                  # its environment: a minute or two
    .venv/bin/python -m bench.openvino_genai export DIR [--int8]    # -> .cache/peers/openvino-genai/ir/...

The pipeline, the exporter (optimum-intel) and the tokenizer converter (openvino-tokenizers) run in
an environment of their own, .cache/peers/openvino-genai/venv (requirements/peer-openvino-genai.txt):
optimum-intel needs an older transformers than the kit's. The bench makes it on first use, exports
the model's own directory (fp32 weights, and int8 ones as its users compress them) and serves it
with bench/openvino_genai_peer.py: the kit's number of sequences, a KV cache for each at the kit's
context, at the kit's precisions (the CPU plugin's inference precision) and int8.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from pathlib import Path

from bench import peer_setup
from bench.peer_setup import PEERS
from kit.paths import ROOT

PEER = PEERS / "openvino-genai"
VENV = PEER / "venv"
PYTHON = VENV / "bin" / "python"
REQUIREMENTS = ROOT / "requirements" / "peer-openvino-genai.txt"
STAMP = VENV / ".installed"
# PyPI's torchvision arrives with optimum-intel and fails to import beside the local torch 2.13
# wheel ("operator torchvision::nms does not exist"), which breaks transformers' imports: removed.
UNUSABLE = ("torchvision",)
INT8 = "int8"  # the weights its users serve: compressed to int8 at export


def log(message: str) -> None:
    print(f"[openvino-genai] {message}", flush=True)


def python() -> Path:
    """The peer environment's python, making the environment first if its requirements changed."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if STAMP.is_file() and STAMP.read_text() == digest:
        return PYTHON
    PEER.mkdir(parents=True, exist_ok=True)
    if not PYTHON.is_file():
        # From the kit's python: venv bases the new environment on the interpreter beneath it.
        peer_setup.run([sys.executable, "-m", "venv", str(VENV)], f"creating {VENV}", PEER / "venv.log", log)
    pip = [str(PYTHON), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)]
    peer_setup.run(pip, "installing OpenVINO GenAI, optimum-intel and torch (2.13.0, the local wheel)",
               PEER / "pip.log", log)  # fmt: skip
    peer_setup.run(
        [str(PYTHON), "-m", "pip", "uninstall", "-y", *UNUSABLE],
        "removing torchvision",
        PEER / "pip-uninstall.log",
        log,
    )
    STAMP.write_text(digest)
    return PYTHON


def ir_dir(model_dir: Path, weights: str) -> Path:
    return PEER / "ir" / f"{peer_setup.derived(model_dir, REQUIREMENTS.read_text())}-{weights}"


def export(model_dir: Path, weights: str) -> Path:
    """The model directory as the pipeline loads it: "fp32" weights, or "int8"."""
    out = ir_dir(model_dir, weights)
    if (out / "openvino_detokenizer.xml").is_file():
        return out
    command = [str(python()), "-m", "bench.openvino_genai_peer", "export", str(model_dir), str(out)]
    command += ["--int8"] if weights == INT8 else []
    out.parent.mkdir(parents=True, exist_ok=True)
    peer_setup.run(
        command, f"exporting {model_dir} to OpenVINO ({weights} weights)", out.with_suffix(".log"), log, cwd=ROOT
    )
    return out


def cache_gb(config: dict, sequences: int, context: int) -> int:
    """GB of KV cache for `sequences` of `context` tokens at 4 bytes a value (the pipeline stores
    less, in its KV cache precision), from the model's config.json."""
    heads = config["num_attention_heads"]
    head_size = config.get("head_dim") or config["hidden_size"] // heads
    per_token = config["num_hidden_layers"] * 2 * config.get("num_key_value_heads", heads) * head_size * 4
    return max(1, math.ceil(per_token * sequences * context / 1e9))


def server_command(ir: Path, port: int, precision: str | None, sequences: int, cache: int) -> list[str]:
    command = [str(python()), "-m", "bench.openvino_genai_peer", "serve", str(ir), "--port", str(port),
               "--sequences", str(sequences), "--cache-gb", str(cache)]  # fmt: skip
    return command + (["--precision", precision] if precision else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="make the peer's environment").set_defaults(act=lambda _: python())
    to_ir = commands.add_parser("export", help="export a Hugging Face directory for the pipeline")
    to_ir.add_argument("model_dir", type=Path)
    to_ir.add_argument("--int8", action="store_true")
    to_ir.set_defaults(act=lambda args: export(args.model_dir, INT8 if args.int8 else "fp32"))
    args = parser.parse_args(argv)
    print(args.act(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
