"""The files that make a directory a built archive (torch-model-archiver's `no-archive` layout),
named once for everything that reads one: the worker (TorchServe serves the directory in place),
the plan, the bench and the build. Light on purpose: no torch behind this import."""

from pathlib import Path

MANIFEST = Path("MAR-INF") / "MANIFEST.json"  # the handler and model name TorchServe reads
MODEL_CONFIG = "model-config.yaml"  # torch-model-archiver's --config-file: TorchServe keys + `handler:`


def is_archive(path: Path) -> bool:
    """Whether `path` is a built archive (a directory with its manifest), not a stale or partial one."""
    return (path / MANIFEST).is_file()


def readable_by_all(directory: Path) -> None:
    """Every file readable and every directory open to every user: copies keep their sources'
    modes, and a file saved 0600 (a checkpoint, a whole graph torch saved) would stop the image's
    non-root workers from reading it."""
    for path in [directory, *directory.rglob("*")]:
        path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
