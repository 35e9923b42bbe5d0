"""Diagnose a served model in this process: `make doctor` and `make profile`.

    .venv/bin/python -m diagnose doctor  --model resnet50 [--variant inductor] [--debug-dump]
    .venv/bin/python -m diagnose profile --model bert [--variant inductor] [--batch 1] [--threads 1]

Both read the built archive (model_store/<variant>/<model>/), so they see exactly what a
worker serves, and write under logs/doctor/ or logs/profile/<model>-<time>/.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from diagnose.doctor import debug_dump, diagnose
from diagnose.profile import profile_model
from handlers.archive import load_archived
from handlers.typed_config import SettingsError
from kit.paths import LOGS
from kit.variant import Variant


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m diagnose", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["doctor", "profile"])
    parser.add_argument("--model", required=True, help="a model of config/models/ (kit/models.py)")
    parser.add_argument("--variant", default="inductor", help="model_store/<variant>/ (default: inductor)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: one served worker)")
    parser.add_argument("--debug-dump", action="store_true", help="doctor: keep the TORCH_COMPILE_DEBUG files")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    out_dir = LOGS / args.command / f"{args.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        archived = load_archived(Variant.load(args.variant).archive(args.model))
    except (FileNotFoundError, SettingsError) as error:
        print(f"[{args.command}] ERROR: {error}", file=sys.stderr)
        return 2
    inputs = archived.example(args.batch)
    if args.command == "profile":
        summary = profile_model(archived, inputs, out_dir)
        print(summary)
        print(f"[profile] files in {out_dir}")
        return 0
    diagnosis = diagnose(args.model, archived.model, inputs, archived.settings, out_dir)
    if args.debug_dump:
        dump = debug_dump(archived.model_dir, out_dir)
        for code in sorted(dump.rglob("output_code.py")):  # one directory per compiled graph
            print(
                f"[doctor] TORCH_COMPILE_DEBUG: {code.parent} (fx_graph_readable.py, ir_pre_fusion.txt, "
                "ir_post_fusion.txt, output_code.py)"
            )
    print(diagnosis.summary())
    print(f"[doctor] files in {out_dir}")
    return 0 if diagnosis.culprit is None else 1


if __name__ == "__main__":
    sys.exit(main())
