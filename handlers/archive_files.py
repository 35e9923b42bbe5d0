"""The files that make a directory a built archive (torch-model-archiver's `no-archive` layout),
named once for everything that reads one: the worker (TorchServe serves the directory in place),
the plan, the bench and the build. Light on purpose: no torch behind this import."""

from pathlib import Path

MANIFEST = Path("MAR-INF") / "MANIFEST.json"  # the handler and model name TorchServe reads
MODEL_CONFIG = "model-config.yaml"  # torch-model-archiver's --config-file: TorchServe keys + `handler:`


def is_archive(path: Path) -> bool:
    """Whether `path` is a built archive (a directory with its manifest), not a stale or partial one."""
    return (path / MANIFEST).is_file()
