"""The models the kit ships: the one list every command reads.

    MODELS["bert"].handler        # handlers/text_classification.py
    MODELS["bert"].task           # Task.TEXT: what a request body is (bench payloads, soak mix)

Each has config/models/<name>.yaml (its model-config.yaml) and a weights recipe in
model_store/build.py.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

from kit.paths import CONFIG


class Task(enum.StrEnum):
    IMAGE = "image"  # JPEG/PNG bytes in
    TEXT = "text"  # UTF-8 text or JSON {"text": ...} in


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    handler: str  # file under handlers/
    task: Task

    @property
    def config(self) -> Path:
        return CONFIG / "models" / f"{self.name}.yaml"


MODELS = {
    m.name: m
    for m in (
        Model("resnet50", "image_classification.py", Task.IMAGE),
        Model("bert", "text_classification.py", Task.TEXT),
        Model("minilm", "sentence_embedding.py", Task.TEXT),
    )
}
MODEL_NAMES = tuple(MODELS)
