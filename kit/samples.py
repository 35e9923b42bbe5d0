"""Your samples (`make model ... SAMPLES=`): request bodies like your traffic, for int8 calibration,
the accuracy guard's held-out checks and the bench's payloads.

    bodies = read_samples(Path("photos/"), Medium.IMAGE)   # [Body(data=b"\\xff\\xd8...", content_type="image/jpeg", ...)]

Each sample is exactly a request body the model's handler decodes, in one of three forms:
- a directory of images (.jpg .jpeg .png .webp .bmp), one per file, in name order: image models;
- a text file (.txt), one example per non-empty line: text models;
- a JSON file holding a list, one body per item: strings for text models, arrays (or
  {"inputs": [...]}) for tensor models.
The archive carries them as samples/<index> (model_store/sources.py; handlers/calibration.py reads
them). Torch-free.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from handlers.typed_config import SettingsError
from kit.models import Medium

IMAGE_TYPES = {
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
    ".webp": "image/webp",
    ".bmp": "image/bmp",
}
TEXT_TYPE, JSON_TYPE = "text/plain", "application/json"
MIN_SAMPLES = 4  # some to calibrate on, at least one held out to check with


@dataclasses.dataclass(frozen=True)
class Body:
    """A request body as bytes: what the soak's clients, the tests, the bench's files and samples are."""

    data: bytes
    content_type: str
    file_name: str


def image_samples(directory: Path) -> list[Body]:
    files = sorted(p for p in directory.iterdir() if p.suffix.lower() in IMAGE_TYPES)
    return [Body(p.read_bytes(), IMAGE_TYPES[p.suffix.lower()], p.name) for p in files]


def text_samples(path: Path) -> list[Body]:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [Body(line.encode(), TEXT_TYPE, f"{i}.txt") for i, line in enumerate(lines) if line]


def json_samples(path: Path, medium: Medium) -> list[Body]:
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise SettingsError(f"SAMPLES {path} is not JSON ({error.msg}, line {error.lineno})") from None
    if not isinstance(items, list):
        raise SettingsError(f"SAMPLES {path} must hold a JSON list, one request body per item")
    if medium is Medium.TEXT:
        if not all(isinstance(item, str) for item in items):
            raise SettingsError(f"SAMPLES {path}: a text model's samples are strings")
        return [Body(item.encode(), TEXT_TYPE, f"{i}.txt") for i, item in enumerate(items)]
    return [Body(json.dumps(item).encode(), JSON_TYPE, f"{i}.json") for i, item in enumerate(items)]


# What each medium accepts, for the error that says so.
FORMS = {
    Medium.IMAGE: "a directory of images (" + " ".join(IMAGE_TYPES) + ")",
    Medium.TEXT: "a .txt file (one example per line) or a .json list of strings",
    Medium.TENSOR: 'a .json list of request bodies (arrays, or {"inputs": [...]})',
}


def read_samples(path: Path, medium: Medium) -> list[Body]:
    """The samples at `path` as request bodies for a model taking `medium`, or a SettingsError."""
    if not path.exists():
        raise SettingsError(f"SAMPLES {path} does not exist")
    if path.is_dir() and medium is Medium.IMAGE:
        bodies = image_samples(path)
    elif path.suffix == ".txt" and medium is Medium.TEXT:
        bodies = text_samples(path)
    elif path.suffix == ".json" and medium is not Medium.IMAGE:
        bodies = json_samples(path, medium)
    else:
        raise SettingsError(f"SAMPLES {path} does not fit {medium.value} models: give {FORMS[medium]}")
    if len(bodies) < MIN_SAMPLES:
        raise SettingsError(
            f"SAMPLES {path} holds {len(bodies)} sample(s); give at least {MIN_SAMPLES} (more calibrate int8 better)"
        )
    return bodies
