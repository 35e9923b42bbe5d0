"""OpenVINO GenAI's continuous-batching pipeline as a peer of PLAN=generate, on the same weights.

    .venv/bin/python -m bench.generate.openvino_genai setup                  # its environment: a minute or two
    .venv/bin/python -m bench.generate.openvino_genai export DIR [--weights float32|float16|int8]   # -> .cache/peers/openvino-genai/ir/...

The pipeline, the exporter (optimum-intel) and the tokenizer converter (openvino-tokenizers) run in
the OpenVINO GenAI environment (model_store/openvino_lm.py), made on first use. The bench exports
the model's own directory as the kit's openvino variants are (openvino_lm.ir_weights: float32
weights for float32, float16 for bf16, int8 as its users compress them) and serves it
with bench/generate/openvino_genai_peer.py: the kit's number of sequences, a KV cache for each at the kit's
context in the kit's KV precision, at the kit's precisions (the CPU plugin's inference precision) and int8.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from bench.generate import peer_setup
from bench.generate.peer_setup import PEERS
from model_store import openvino_lm
from model_store.openvino_lm import IrWeights, python

PEER = PEERS / "openvino-genai"


def log(message: str) -> None:
    print(f"[openvino-genai] {message}", flush=True)


def ir_dir(model_dir: Path, weights: IrWeights) -> Path:
    return PEER / "ir" / f"{peer_setup.derived(model_dir, openvino_lm.REQUIREMENTS.read_text())}-{weights}"


def export(model_dir: Path, weights: IrWeights) -> Path:
    """The model directory as the pipeline loads it, its weights stored as `weights`."""
    out = ir_dir(model_dir, weights)
    if (out / "openvino_detokenizer.xml").is_file():
        return out
    return openvino_lm.export(model_dir, out, weights, log)


# Bytes a value of the KV cache takes, per KV_CACHE_PRECISION the bench sets (systems.KV_TYPES).
KV_BYTES = {"f32": 4, "bf16": 2}


def cache_gb(config: dict, sequences: int, context: int, kv: str) -> int:
    """GB of KV cache for `sequences` of `context` tokens held as `kv`, from the model's
    config.json (the pipeline's unit is a GB: rounded up)."""
    heads = config["num_attention_heads"]
    head_size = config.get("head_dim") or config["hidden_size"] // heads
    per_token = config["num_hidden_layers"] * 2 * config.get("num_key_value_heads", heads) * head_size * KV_BYTES[kv]
    return max(1, math.ceil(per_token * sequences * context / 1e9))


def server_command(ir: Path, port: int, precision: str | None, sequences: int, cache: int, kv: str) -> list[str]:
    command = [
        str(python()),
        "-m",
        "bench.generate.openvino_genai_peer",
        "serve",
        str(ir),
        "--port",
        str(port),
        "--sequences",
        str(sequences),
        "--cache-gb",
        str(cache),
        "--kv-precision",
        kv,
    ]
    return command + (["--precision", precision] if precision else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="make the peer's environment").set_defaults(act=lambda _: python())
    to_ir = commands.add_parser("export", help="export a Hugging Face directory for the pipeline")
    to_ir.add_argument("model_dir", type=Path)
    to_ir.add_argument("--weights", type=IrWeights, choices=list(IrWeights), default=IrWeights.FLOAT32)
    to_ir.set_defaults(act=lambda args: export(args.model_dir, args.weights))
    args = parser.parse_args(argv)
    print(args.act(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
