"""A built archive's model in this process, exactly as its handler would load it.

    archived = load_archived(Path("model_store/inductor/mine"))
    inputs = archived.example(batch_size=1)     # the handler's own warm-up inputs
    archived.model(*inputs)                     # eager, unoptimized

For everything that runs a served model without a server: the bench's in-process rows,
`make profile` and `make doctor`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
from pathlib import Path

import yaml
from torch import nn

from handlers.archive_files import MANIFEST, MODEL_CONFIG, is_archive
from handlers.backends.common import Inputs
from handlers.base import OptimizedHandler
from handlers.loaders import load_model
from handlers.settings import OptimizationSettings
from handlers.typed_config import parse_settings


@dataclasses.dataclass(frozen=True)
class ArchivedModel:
    name: str
    model_dir: Path
    settings: OptimizationSettings  # the archive's `handler:` section, parsed as the worker does
    model: nn.Module  # eval mode, as loaded: no layout, dtype or backend applied
    handler: OptimizedHandler  # set up, not initialized: its example(), calibration() and held_out()

    def example(self, batch_size: int) -> Inputs:
        return self.handler.example(batch_size)


def read_manifest(model_dir: Path) -> dict:
    if not is_archive(model_dir):
        raise FileNotFoundError(f"{model_dir} is not a built archive; build it with `make archive`")
    return json.loads((model_dir / MANIFEST).read_text())


def handler_class(handler_file: str) -> type[OptimizedHandler]:
    """The handler class defined in handlers/<handler_file> (a path or a file name)."""
    module = importlib.import_module(f"handlers.{Path(handler_file).stem}")
    (cls,) = [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
    return cls


def bare_handler(handler_file: str, handler_config: dict, model_dir: Path) -> OptimizedHandler:
    """A handler with settings parsed and its files loaded, not initialized: for example()/calibration()."""
    cls = handler_class(handler_file)
    handler = cls()
    handler.settings = parse_settings(cls.settings_class, handler_config)
    handler.load_files(str(model_dir))
    return handler


def handler_section(model_dir: Path) -> dict:
    """The archive's `handler:` section, as written at build time."""
    return (yaml.safe_load((model_dir / MODEL_CONFIG).read_text()) or {}).get("handler") or {}


def archived_settings(model_dir: Path) -> OptimizationSettings:
    """A built archive's `handler:` settings, parsed as its worker does, without loading its files."""
    cls = handler_class(read_manifest(model_dir)["model"]["handler"])
    return parse_settings(cls.settings_class, handler_section(model_dir))


def archived_handler(model_dir: Path, overrides: dict | None = None) -> OptimizedHandler:
    """The bare handler of a built archive (its decode, format, example); `overrides` replace `handler:` keys."""
    handler_file = read_manifest(model_dir)["model"]["handler"]
    return bare_handler(handler_file, {**handler_section(model_dir), **(overrides or {})}, model_dir)


def load_archived(model_dir: Path, overrides: dict | None = None) -> ArchivedModel:
    """The model and settings of a built archive; `overrides` replace `handler:` keys."""
    handler = archived_handler(model_dir, overrides)
    model = load_model(handler.settings, model_dir)
    return ArchivedModel(read_manifest(model_dir)["model"]["modelName"], model_dir, handler.settings, model, handler)
