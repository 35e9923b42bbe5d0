"""Request bodies for the bench: a photo-like 640x480 JPEG (~100 KB) and a 128-token text.

payload = payload_for("resnet50", out_dir)   # Payload(path=..., content_type="image/jpeg")
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
from PIL import Image

from kit.models import MODELS, Task

TEXT_TOKENS = 128  # including [CLS] and [SEP]: exactly the served max_length, nothing padded
PARAGRAPH = (
    "The committee met on a grey Tuesday morning to review the quarterly results, and although the "
    "numbers were better than expected, several members worried that rising costs for energy, shipping "
    "and skilled labour would erode the margin before the end of the year. After a long discussion about "
    "pricing, inventory and the new distribution centre near the river, they agreed to postpone the "
    "expansion, to renegotiate two supplier contracts, and to publish a more cautious forecast for the "
    "next two quarters, while the chair reminded everyone that customer satisfaction scores had reached "
    "their highest level in five years and that the support team deserved a formal note of thanks. "
    "The meeting closed shortly before noon, and the minutes were circulated to every department that afternoon."
)


@dataclasses.dataclass(frozen=True)
class Payload:
    path: Path
    content_type: str


def photo_jpeg(width: int = 640, height: int = 480) -> bytes:
    # Smooth gradients plus grain: compresses like a photo (a flat image would be ~10 KB).
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width * 255, y / height * 255, (x + y) / (width + height) * 255], axis=-1)
    pixels = np.clip(base + rng.normal(0, 16, base.shape), 0, 255).astype("uint8")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


# Real photographs shipped inside scikit-image (its data directory: nothing is downloaded).
PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "motorcycle_left.png", "rocket.jpg", "retina.jpg")
PHONE = (4032, 3024)  # a 12 MP phone photo


def phone_jpeg(name: str) -> bytes:
    """A real photograph as a phone sends it: upscaled to 4032x3024, JPEG quality 90 (~1 MB)."""
    import importlib.resources

    source = importlib.resources.files("skimage") / "data" / name
    picture = Image.open(io.BytesIO(source.read_bytes())).convert("RGB").resize(PHONE, Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def sentence(tokens: int = TEXT_TOKENS) -> str:
    """The paragraph cut to exactly `tokens` bert-base-uncased tokens including [CLS]/[SEP]."""
    from handlers.text import load_tokenizer
    from model_store.build import minilm_dir

    tokenizer = load_tokenizer(minilm_dir())
    tokenizer.no_truncation()  # the whole paragraph, then cut here
    tokenizer.no_padding()
    ids = tokenizer.encode(PARAGRAPH, add_special_tokens=False).ids
    if len(ids) < tokens - 2:
        raise ValueError(f"paragraph has only {len(ids)} tokens; need {tokens - 2}")
    return tokenizer.decode(ids[: tokens - 2])


@dataclasses.dataclass(frozen=True)
class Body:
    """A request body for a task, as bytes: what the soak's clients and the bench's files send."""

    data: bytes
    content_type: str
    file_name: str


def body_for(task: Task) -> Body:
    if task is Task.IMAGE:
        return Body(photo_jpeg(), "image/jpeg", "photo.jpg")
    return Body(sentence().encode(), "text/plain", "sentence.txt")


def payload_for(model: str, out_dir: Path) -> Payload:
    """The model's body as a file for ab (written once per run directory)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    body = body_for(MODELS[model].task)
    path = out_dir / body.file_name
    if not path.is_file():
        path.write_bytes(body.data)
    return Payload(path, body.content_type)
