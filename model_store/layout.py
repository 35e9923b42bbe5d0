"""An archive laid out on disk: torch-model-archiver's directory form written beside and renamed
into place, readable by every user, its large files hard links to the same bytes in the model's
other archives (model_store/build.py decides what goes in; this module only writes it)."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from handlers.archive_files import readable_by_all
from kit.paths import ROOT

# Files at least this large are looked for in a model's other archives (its weights, its
# float checkpoint kept for fallback): a 2 GB language model's eager and inductor archives held
# the same model.safetensors twice, BERT's checkpoint was on disk once per variant.
SHARED_MIN_BYTES = 1 << 20


def share_identical(archive: Path, others: list[Path]) -> int:
    """Each large file of `archive` that another archive holds at the same path with the same
    bytes becomes a hard link to that one; returns the bytes now shared. Safe because no archive
    file is ever written in place: a rebuild writes a new directory and renames it over the old."""
    shared = 0
    for path in archive.rglob("*"):
        if not path.is_file() or path.is_symlink() or path.stat().st_size < SHARED_MIN_BYTES:
            continue
        relative = path.relative_to(archive)
        for other in others:
            twin = other / relative
            if other == archive or not twin.is_file() or twin.stat().st_size != path.stat().st_size:
                continue
            if twin.stat().st_ino == path.stat().st_ino or not filecmp.cmp(twin, path, shallow=False):
                continue
            link = path.with_name(f".{path.name}.link")
            try:
                os.link(twin, link)
            except OSError:  # another file system, or links refused: the copy stays
                continue
            link.replace(path)
            shared += path.stat().st_size
            break
    return shared


def pack(name: str, handler: Path, files: Path, config_file: Path, store: Path) -> Path:
    """`store/<name>/`: `files`, the kit's `handlers/` package and `config_file` laid out by
    torch-model-archiver, written beside and renamed into place (a failed build leaves none)."""
    shutil.copytree(ROOT / "handlers", files / "handlers", ignore=shutil.ignore_patterns("__pycache__"))
    export = store / f".{name}.partial"
    shutil.rmtree(export, ignore_errors=True)
    export.mkdir(parents=True)
    try:
        # torch-model-archiver stages in $TMPDIR/<model name> and deletes that directory first and
        # after: with the system's TMPDIR, a source at /tmp/<name> (`make model NAME=lm SRC=/tmp/lm`)
        # would be deleted. It stages in a directory of its own instead.
        with tempfile.TemporaryDirectory(prefix=f"kit-{name}-archiver-", dir=files.parent) as archiver_tmp:
            options = {
                "--model-name": name,
                "--version": "1.0",
                "--handler": str(handler),
                "--extra-files": str(files),
                "--config-file": str(config_file),
                "--export-path": str(export),
                "--archive-format": "no-archive",
            }
            command = [str(Path(sys.executable).parent / "torch-model-archiver"), *sum(options.items(), ())]
            subprocess.run(command, check=True, env={**os.environ, "TMPDIR": archiver_tmp})
        readable_by_all(export / name)
        target = store / name
        shutil.rmtree(target, ignore_errors=True)
        (export / name).replace(target)
    finally:
        shutil.rmtree(export, ignore_errors=True)
    return target
