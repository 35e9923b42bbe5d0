"""A variant: config/variants/<name>.yaml, parsed once into what every part of the kit reads.

    variant = Variant.load("openvino-int8")
    variant.backend, variant.dtype        # Backend.OPENVINO, DType.INT8
    variant.environment                   # ROOT/.venv (the ipex variants: ROOT/.venv-ipex)
    variant.preloaded_allocator           # False: its workers keep glibc malloc
    variant.archive("mine")               # ROOT/model_store/openvino-int8/mine/

A variant file is an overlay of each model's config/models/<model>.yaml, applied when its
archives are built; its `handler:` section holds backend settings only (backend, mode, dtype,
...), checked here. The backend's traits come from the registry (handlers/backends).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import yaml

from handlers.backends import Backend, BackendTraits, DType, cpu_refusal
from handlers.settings import OptimizationSettings
from handlers.typed_config import SettingsError, parse_settings
from kit.paths import CONFIG, ROOT, STORE

VARIANTS = CONFIG / "variants"


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    settings: OptimizationSettings  # the `handler:` section, parsed
    overlay: dict[str, Any] = dataclasses.field(compare=False, repr=False)  # the file as written

    @classmethod
    def load(cls, name: str) -> Variant:
        return _load(name)

    @property
    def backend(self) -> Backend:
        return self.settings.backend

    @property
    def dtype(self) -> DType:
        return self.settings.dtype

    @property
    def traits(self) -> BackendTraits:
        return self.settings.traits

    @property
    def environment(self) -> Path:
        """The Python environment that serves this variant's archives."""
        return ROOT / self.traits.environment

    def refusal(self) -> str:
        """Why this CPU does not serve the variant ("" when it does): bf16 without AMX or AVX512_BF16."""
        return cpu_refusal(self.dtype)

    @property
    def preloaded_allocator(self) -> bool:
        return self.traits.preloaded_allocator

    @property
    def store(self) -> Path:
        return STORE / self.name

    def archive(self, model: str) -> Path:
        """The model's archive: a directory (MAR-INF/MANIFEST.json inside) TorchServe serves in place."""
        return self.store / model


def variant_names() -> list[str]:
    return sorted(path.stem for path in VARIANTS.glob("*.yaml"))


@functools.cache
def _load(name: str) -> Variant:
    path = VARIANTS / f"{name}.yaml"
    if not path.is_file():
        raise SettingsError(f"variant {name!r} is unknown; choose one of: {', '.join(variant_names())}")
    overlay = yaml.safe_load(path.read_text()) or {}
    try:
        settings = parse_settings(OptimizationSettings, overlay.get("handler"))
    except SettingsError as error:
        raise SettingsError(f"{path.relative_to(ROOT)}: {error}") from None
    return Variant(name, settings, overlay)
