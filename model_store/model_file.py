"""Write a model file for your own model: config/models/<name>.yaml (what `make model` runs).

    .venv/bin/python -m model_store.model_file mine /data/my-roberta               # task from config.json
    .venv/bin/python -m model_store.model_file net /data/net.pt2 --task image-classification
    .venv/bin/python -m model_store.model_file ranker /data/ranker.pt2 --task tensor  # JSON numbers
    .venv/bin/python -m model_store.model_file lm /data/lm --set weights=int8 --set kv_cache=int8

A directory is a Hugging Face Transformers directory (save_pretrained); a file, a torch.export
program. What the source already says (labels, tokenizer, image preprocessing) is read from it
when the archives are built; the file holds only what it does not say, and your overrides.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from handlers.typed_config import SettingsError
from kit.models import Medium, Model, SourceKind, Task, model_file, parse_model
from kit.samples import read_samples
from model_store import exported, huggingface

NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")  # a TorchServe model name, a URL path segment, a file stem


def source_of(path: Path) -> SourceKind:
    if path.is_dir():
        return SourceKind.HUGGINGFACE
    if path.is_file() and path.suffix == ".pt2":
        return SourceKind.EXPORTED
    raise SettingsError(f"SRC {path} is neither a Hugging Face directory nor a .pt2 file (torch.export.save)")


def model_document(
    name: str,
    source: Path,
    task: Task | None,
    samples: Path | None = None,
    tolerance: float | None = None,
    settings: dict | None = None,
) -> dict:
    if not NAME.fullmatch(name):
        raise SettingsError(f"NAME {name!r} must be lower-case letters, digits, '-' or '_' (it is a URL path)")
    kind = source_of(source)
    if task is None and kind is SourceKind.EXPORTED:
        raise SettingsError(f"an exported program does not say its task; give TASK={' | '.join(Task)}")
    task = task or huggingface.guess_task(source)
    document = {"source": {kind.value: str(source.resolve())}, "task": task.value}
    if task is Task.TENSOR:
        if kind is not SourceKind.EXPORTED:
            raise SettingsError("TASK=tensor serves a torch.export program: give SRC=<file.pt2>")
        # What one request sends: the file says it, so you can read it and clients can be written.
        document["handler"] = exported.tensor_inputs(source)
    if kind is SourceKind.HUGGINGFACE:
        huggingface.derive(source, task)  # refuse now, by name, what the build would refuse
    elif task.medium is Medium.TEXT:
        exported.text_inputs(source)
    if samples is not None:
        read_samples(samples, task.medium)  # the form fits the task, and there are enough
        document["samples"] = str(samples.resolve())
    if tolerance is not None:  # the accuracy guard's limit for this model (handlers/accuracy.py)
        document.setdefault("handler", {})["accuracy_tolerance"] = tolerance
    if settings:  # the task's handler settings, written now: no build of the archives without them
        document.setdefault("handler", {}).update(settings)
    parse_model(name, document)  # the file the registry will read: valid before it is written
    return document


def write_model_file(
    name: str,
    source: Path,
    task: Task | None,
    force: bool = False,
    samples: Path | None = None,
    tolerance: float | None = None,
    settings: dict | None = None,
) -> Path:
    path = model_file(name)
    if path.exists() and not force:
        existing = Model.load(name)
        raise SettingsError(
            f"{path} already exists ({existing.source.kind.value} {existing.source.location}); pass FORCE=1 to replace it"
        )
    document = model_document(name, source, task, samples, tolerance, settings)
    header = (
        f"# {name}: written by `make model`. Add TorchServe keys (responseTimeout, ...) or a `handler:`\n"
        "# section (handlers/settings.py: max_length, top_k, ...) to override what the source says.\n"
    )
    path.write_text(header + yaml.safe_dump(document, sort_keys=False))
    return path


def setting(text: str) -> tuple[str, object]:
    """KEY=VALUE, the value read as YAML (32, true, [1, 2], continuous) as the model file would hold it."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (a handler setting, e.g. prefill_chunk=32)")
    return key, yaml.safe_load(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name")
    parser.add_argument("source", type=Path, help="a Hugging Face directory or a .pt2 file")
    parser.add_argument("--task", type=Task, choices=list(Task), default=None)
    parser.add_argument("--force", action="store_true", help="replace an existing model file")
    parser.add_argument("--samples", type=Path, default=None, help="request bodies like your traffic (kit/samples.py)")
    parser.add_argument(
        "--tolerance", type=float, default=None, help="the accuracy guard's limit (handlers/accuracy.py TOLERANCES)"
    )
    parser.add_argument(
        "--set",
        type=setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a handler setting of the task (handlers/settings.py), written into the file's `handler:`",
    )
    args = parser.parse_args(argv)
    try:
        path = write_model_file(
            args.name, args.source, args.task, args.force, args.samples, args.tolerance, dict(args.set)
        )
    except SettingsError as error:
        sys.exit(f"[model] ERROR: {error}")
    print(f"[model] wrote {path}: serve it with make serve MODELS={args.name}", flush=True)


if __name__ == "__main__":
    main()
