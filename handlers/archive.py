"""A built archive's model in this process, exactly as its handler would load it.

    archived = load_archived(extract(Path("model_store/inductor/resnet50.mar"), Path("/tmp/x")))
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
import zipfile
from pathlib import Path

import yaml
from torch import nn

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


def extract(archive: Path, into: Path) -> Path:
    """Unpack `archive` once into `into/<variant>-<model>` and return that directory."""
    target = into / f"{archive.parent.name}-{archive.stem}"
    if not (target / "MAR-INF" / "MANIFEST.json").is_file():
        if not archive.is_file():
            raise FileNotFoundError(f"{archive} does not exist; build it with `make archive`")
        with zipfile.ZipFile(archive) as mar:
            mar.extractall(target)
    return target


def read_manifest(model_dir: Path) -> dict:
    return json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())


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


def archived_settings(archive: Path) -> OptimizationSettings:
    """A built archive's `handler:` settings, parsed as its worker does, read without unpacking it."""
    with zipfile.ZipFile(archive) as mar:
        manifest = json.loads(mar.read("MAR-INF/MANIFEST.json"))
        config = yaml.safe_load(mar.read("model-config.yaml")) or {}
    return parse_settings(handler_class(manifest["model"]["handler"]).settings_class, config.get("handler") or {})


def archived_handler(model_dir: Path, overrides: dict | None = None) -> OptimizedHandler:
    """The bare handler of an extracted archive (its decode, format, example); `overrides` replace `handler:` keys."""
    config = yaml.safe_load((model_dir / "model-config.yaml").read_text()) or {}
    handler_config = {**(config.get("handler") or {}), **(overrides or {})}
    return bare_handler(read_manifest(model_dir)["model"]["handler"], handler_config, model_dir)


def load_archived(model_dir: Path, overrides: dict | None = None) -> ArchivedModel:
    """The model and settings of an extracted archive; `overrides` replace `handler:` keys."""
    handler = archived_handler(model_dir, overrides)
    model = load_model(handler.settings, model_dir)
    return ArchivedModel(read_manifest(model_dir)["model"]["modelName"], model_dir, handler.settings, model, handler)
