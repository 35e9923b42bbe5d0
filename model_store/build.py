"""Build the model archives: model_store/<variant>/<model>/ with torch-model-archiver.

    .venv/bin/python -m model_store.build                         # every model x every variant
    .venv/bin/python -m model_store.build --models mine --variants inductor,openvino-int8

A model is its file, config/models/<model>.yaml (kit/models.py). An archive holds the files its
source makes (model_store/sources.py), the kit's `handlers/` package and a model-config.yaml:
the model file's TorchServe keys, its handler settings over what the source implies, overlaid
with config/variants/<variant>.yaml. A stamp of those inputs makes re-runs skip unchanged archives.

An archive is a directory (torch-model-archiver's `no-archive` form, MAR-INF/MANIFEST.json inside):
TorchServe serves a directory of its model store in place, where it would unzip a .mar into its
temp directory at every start (half a minute for a 2 GB language model on 2 cores: docs/generation.md,
"Start"; and a copy on disk per running server).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from handlers.archive_files import MODEL_CONFIG, is_archive
from handlers.backends import DEFAULT_ENVIRONMENT
from handlers.typed_config import SettingsError
from kit import long_step
from kit.models import Model, SourceKind, check_models, model_names
from kit.paths import INDUCTOR_CACHE, ROOT, process_environment
from kit.variant import Variant, variant_names
from model_store.layout import pack, share_identical
from model_store.sources import write_source

# The largest archive (bert, aoti-int8) is 1.2 GB and exists three times while it is built: the
# staged files, torch-model-archiver's copy of them under TMPDIR, and the archive being written.
MIN_FREE_GB = 4


class VariantRefused(Exception):
    """A variant cannot serve the model (its accuracy guard failed, or it cannot load it): no archive."""


# IPEX's environment runs torch 2.8 (handlers/backends: `environment`); measured: its
# torch.export.load stops at "There is no item named 'version' in the archive".
OTHER_TORCH_CANNOT_LOAD = (
    "its workers run another torch (IPEX needs torch 2.8, in .venv-ipex), which cannot read a .pt2 that "
    "torch 2.13 wrote (the archive format changed); serve it with inductor, aoti or openvino, or give "
    "the model as a Hugging Face directory, which every variant loads"
)


def log(message: str) -> None:
    print(f"[archive] {message}", flush=True)


def merged_config(base: dict, overlay: dict) -> dict:
    merged = {**base, **{k: v for k, v in overlay.items() if k != "handler"}}
    merged["handler"] = {**base.get("handler", {}), **overlay.get("handler", {})}
    return merged


def inputs_digest(*parts: object) -> str:
    digest = hashlib.sha256()
    sources = [
        *(ROOT / "handlers").rglob("*.py"),
        *(ROOT / "handlers").rglob("*.cpp"),
        *(ROOT / "model_store").glob("*.py"),
    ]
    for path in sorted(sources):
        digest.update(path.read_bytes())
    for part in parts:
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def compile_ahead(handler_file: str, handler_config: dict, staging: Path, label: str) -> None:
    """Precompiled backends (aoti, openvino): compile and calibrate now, ship the artifact. A backend
    the worker compiles at bf16: ship the evidence its workers judge it on."""
    from handlers.accuracy import AccuracyError
    from handlers.archive import bare_handler, handler_class
    from handlers.backends import DType, cpu_refusal
    from handlers.loaders import load_model
    from handlers.precompile import HELD_OUT_WANTED, check_artifact, judged_in_worker, precompile, ship_evidence
    from handlers.samples import HELD_OUT_SHARE
    from handlers.streaming import StreamingHandler

    if issubclass(handler_class(handler_file), StreamingHandler):
        # A language model: its workers judge it at their start, on the float answers shipped
        # here; an inductor variant's compiled graphs ship in the archive, an openvino variant's IR too.
        from handlers.generation.settings import GenerationSettings
        from handlers.typed_config import parse_settings
        from model_store.lm_reference import ship_reference

        settings = parse_settings(GenerationSettings, handler_config)
        ship_reference(settings, staging, label.split("/")[-1], lambda said: log(f"{label}: {said}"))
        compile_language_model(handler_config, staging, label)
        export_language_model(handler_config, staging, label)
        return
    handler = bare_handler(handler_file, handler_config, staging)
    if judged_in_worker(handler.settings):
        count = ship_evidence(handler, load_model(handler.settings, staging), staging)
        log(
            f"{label}: float32 eager's answers on {count} inputs shipped; each worker judges its compiled model on them"
        )
        return
    if not handler.settings.traits.precompiled:
        return
    if refusal := cpu_refusal(handler.settings.dtype):
        raise VariantRefused(f"{label} is not built: {refusal}")
    start = time.perf_counter()
    model = load_model(handler.settings, staging)
    if handler.settings.dtype is DType.INT8 and not handler.samples.user:
        log(
            f"{label}: WARNING int8 calibrates on the kit's synthetic samples; make model ... SAMPLES=<yours> calibrates on your traffic"
        )
    precompile(handler, model, staging, progress=lambda message: log(f"{label}: {message}"))
    log(f"{label}: precompiled for {handler.settings.backend.value} in {time.perf_counter() - start:.0f}s")
    try:
        check = check_artifact(handler, model, staging)
    except AccuracyError as error:
        raise VariantRefused(f"{label} is not installed: {error}") from None
    log(f"{label}: {check.summary(handler.classifier)}")
    if check.held_out < HELD_OUT_WANTED:
        log(
            f"{label}: WARNING only {check.held_out} held-out input(s) judged this build (a quarter of your samples is "
            f"held out): give at least {math.ceil(HELD_OUT_WANTED / HELD_OUT_SHARE)} samples with make model ... SAMPLES= for "
            f"{HELD_OUT_WANTED} or more"
        )


# A Hugging Face directory's weights, which an openvino variant's archive does not need: the IR
# holds them (the tokenizer, config.json and generation_config.json stay; the worker reads them).
HF_WEIGHTS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin")


# What a language model worker's READY line says it compiled (handlers/text_generation.py).
GRAPHS = re.compile(r"graphs=\d+ \(\d+ loaded whole, \d+ from the compile cache\)")


def compile_language_model(handler_config: dict, staging: Path, label: str) -> None:
    """A language model's inductor variant: a worker's start run now, in a process of its own with an
    Inductor cache of its own (model_store/lm_compile.py), and that cache shipped in the archive:
    the first start on a machine like this one finds its graphs compiled
    (handlers/generation/compiled.py). Judged as the worker judges it: a refusal installs nothing."""
    from handlers.backends import Backend
    from handlers.backends.inductor import HEADERS
    from handlers.generation.settings import GenerationSettings
    from handlers.typed_config import parse_settings
    from model_store.lm_compile import REFUSED, start_command, start_environment

    if parse_settings(GenerationSettings, handler_config).backend is not Backend.INDUCTOR:
        return
    name = label.split("/")[-1]
    log_file = staging.parent / "compile.log"  # beside the staged files: not in the archive
    with tempfile.TemporaryDirectory(prefix="kit-compile-") as cache:
        try:
            lines = long_step.run(
                start_command(staging, name, handler_config),
                f"{label}: compiling its graphs as a worker's start does",
                log_file,
                log,
                cwd=ROOT,
                env=start_environment(cache, INDUCTOR_CACHE / HEADERS),
            )
        except long_step.StepFailed as failed:
            if failed.returncode == REFUSED:  # the worker's accuracy guard: its reason is its last line
                raise VariantRefused(f"{label} is not installed: {failed.last_line}") from None
            raise
    graphs = next((found.group() for line in reversed(lines) if (found := GRAPHS.search(line))), "graphs not said")
    log(f"{label}: {lines[-1]} ({graphs})")


def export_language_model(handler_config: dict, staging: Path, label: str) -> None:
    """A language model's openvino variant: the IR exported (openvino_lm.ir_weights) into the
    archive, judged against the float32 model as its worker will compute it (the guard's
    precisions), then the source's weights left out."""
    from handlers.accuracy import AccuracyError
    from handlers.backends import Backend, cpu_refusal
    from handlers.generation import agreement, openvino_engine
    from handlers.generation.settings import GenerationSettings
    from handlers.settings import Weights
    from handlers.typed_config import parse_settings
    from model_store import openvino_lm
    from model_store.lm_reference import float_reference

    settings = parse_settings(GenerationSettings, handler_config)
    if settings.backend is not Backend.OPENVINO:
        return
    if refusal := cpu_refusal(settings.dtype):
        raise VariantRefused(f"{label} is not built: {refusal}")
    say = lambda message: log(f"{label}: {message}")  # noqa: E731 - one line, passed on
    weights = openvino_lm.ir_weights(settings.dtype, settings.weights is Weights.INT8)
    ir = openvino_lm.export(staging, staging / openvino_engine.DIRECTORY, weights, say, label.replace("/", "-"))
    if (guard := agreement.limits(settings)) is not None:
        start = time.perf_counter()
        reference = float_reference(staging, settings, label.split("/")[-1])
        agreed = agreement.measure(openvino_engine.Forward.load(ir, settings.dtype, settings.kv_cache), reference)
        say(
            f"accuracy against float32 ({settings.precision}, judged in {time.perf_counter() - start:.0f}s): {agreed.summary()}"
        )
        try:
            agreement.require(agreed, guard, settings.precision)
        except AccuracyError as error:
            raise VariantRefused(f"{label} is not installed: {error}") from None
    for pattern in HF_WEIGHTS:
        for path in staging.glob(pattern):
            path.unlink()


def require_free_space(paths: list[Path], what: str) -> None:
    for path in paths:
        free_gb = shutil.disk_usage(path).free / 1e9
        if free_gb < MIN_FREE_GB:
            sys.exit(
                f"[archive] ERROR: {free_gb:.1f} GB free in {path}; building {what} needs {MIN_FREE_GB} GB. "
                "Free space there (`make clean` removes the archives, old bench/results runs can go) and rerun."
            )


def source_stamp(model: Model) -> list[tuple[str, float]]:
    """Every file the model is made from, with its modification time (a directory: each file in it)."""
    files = [f for path in model.inputs for f in ([path] if path.is_file() else sorted(path.rglob("*")))]
    return [(str(f), os.path.getmtime(f)) for f in files if f.is_file()]


@contextlib.contextmanager
def building(out_dir: Path, name: str, label: str) -> Iterator[None]:
    """One build of an archive at a time, across processes (two `make archive` at once, or CI's
    builds beside its tests): a second waits, then finds it up to date. The lock is the kernel's
    (flock): a build that dies releases it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f".{name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{label}: another build of it is running; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def archive(model: Model, variant: Variant) -> Path:
    name = model.name
    target = variant.archive(name)
    out_dir = target.parent
    label = f"{variant.name}/{name}"
    with building(out_dir, name, label):
        return built(model, variant, target, label)


def built(model: Model, variant: Variant, target: Path, label: str) -> Path:
    """`target`, built unless its stamp says it is up to date."""
    name, out_dir = model.name, target.parent
    stamp = out_dir / f".{name}.digest"
    digest = inputs_digest(name, model.file.read_text(), variant.overlay, source_stamp(model))
    if is_archive(target) and stamp.is_file() and stamp.read_text() == digest:
        log(f"{label} is up to date")
        return target
    start = time.perf_counter()
    # Stale (or the .mar of an older kit): its space is needed for the new one.
    shutil.rmtree(target, ignore_errors=True)
    target.with_name(f"{name}.mar").unlink(missing_ok=True)
    if model.source.kind is SourceKind.EXPORTED and variant.traits.environment != DEFAULT_ENVIRONMENT:
        raise VariantRefused(f"{label} is not installed: {OTHER_TORCH_CANNOT_LOAD}")
    require_free_space([out_dir, Path(tempfile.gettempdir())], label)
    with tempfile.TemporaryDirectory(prefix=f"kit-{name}-") as tmp:
        staging = Path(tmp) / "files"
        staging.mkdir()
        handler_settings = write_source(staging, model)
        config = merged_config({**model.serving, "handler": handler_settings}, variant.overlay)
        compile_ahead(model.task.handler, config["handler"], staging, label)
        config_file = Path(tmp) / MODEL_CONFIG
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        pack(name, ROOT / "handlers" / model.task.handler, staging, config_file, out_dir)
    stamp.write_text(digest)
    size = sum(path.stat().st_size for path in target.rglob("*") if path.is_file())
    shared = share_identical(target, [store / name for store in out_dir.parent.iterdir() if store.is_dir()])
    also = f", of which {shared / 1e6:.0f} MB shared with its other variants' archives" if shared else ""
    log(f"{label} built in {time.perf_counter() - start:.0f}s ({size / 1e6:.0f} MB{also})")
    return target


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = model_names()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(names), help="comma list of " + ", ".join(names))
    parser.add_argument(
        "--variants", default=",".join(variant_names()), help="comma list of " + ", ".join(variant_names())
    )
    parser.add_argument(
        "--where-supported",
        action="store_true",
        help="skip, saying why, the variants this CPU cannot serve (bf16 without AMX or AVX512_BF16) instead of failing",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    options = parse_args(argv)
    os.environ.update(process_environment({}))
    try:
        models = options.models.split(",")
        check_models(models)
        variants = [Variant.load(name) for name in options.variants.split(",")]
    except SettingsError as error:
        sys.exit(f"[archive] ERROR: {error}")
    refused = []
    for variant in variants:
        if options.where_supported and (reason := variant.refusal()):
            log(f"{variant.name} skipped on this CPU: {reason}")
            continue
        for name in models:
            try:
                archive(Model.load(name), variant)
            except SettingsError as error:
                sys.exit(f"[archive] ERROR: {error}")
            except VariantRefused as refusal:
                log(f"REFUSED {refusal}")
                refused.append(str(refusal))
    if refused:
        sys.exit(f"[archive] ERROR: {len(refused)} archive(s) refused and not installed: {'; '.join(refused)}")


if __name__ == "__main__":
    main()
