"""Request bodies for the bench, by name: what people send to an image or a text model.

    payload = write_payload("phone", model, out_dir)   # Payload(name="phone", path=..., content_type="image/jpeg")
    body = body_for(Model.load("mine"))                 # the default body of what the model takes

Images: a thumbnail, a photo-like 640x480 JPEG (the default), a 12 MP phone photo (a real
photograph), a PNG with an alpha channel. Text: a short query, a typical 128-token passage (the
default: exactly the served max_length), an over-length document (truncated by the handler).
Tensor models: one request shaped as the model file declares. A model with samples of its own
(`make model ... SAMPLES=`) is sent the first of them by default (`sample`).
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from handlers.settings import TensorSettings, TensorType
from handlers.typed_config import SettingsError
from kit.models import Medium, Model
from kit.samples import Body, read_samples

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


def photo_jpeg(width: int = 640, height: int = 480) -> bytes:
    # Smooth gradients plus grain: compresses like a photo (a flat image would be ~10 KB).
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width * 255, y / height * 255, (x + y) / (width + height) * 255], axis=-1)
    pixels = np.clip(base + rng.normal(0, 16, base.shape), 0, 255).astype("uint8")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


# Real photographs shipped inside packages (nothing is downloaded): scikit-image's samples and
# matplotlib's portrait of Grace Hopper, as "package/path inside it".
PHOTOS = (
    *(
        f"skimage/data/{name}"
        for name in (
            "astronaut.png",
            "chelsea.png",
            "coffee.png",
            "motorcycle_left.png",
            "motorcycle_right.png",
            "rocket.jpg",
            "retina.jpg",
            "hubble_deep_field.jpg",
            "ihc.png",
            "camera.png",
        )
    ),
    "matplotlib/mpl-data/sample_data/grace_hopper.jpg",
)
PHONE = (4032, 3024)  # a 12 MP phone photo


def photo(name: str) -> Image.Image:
    """One of PHOTOS as an RGB image."""
    import importlib.resources

    package, _, path = name.partition("/")
    return Image.open(io.BytesIO((importlib.resources.files(package) / path).read_bytes())).convert("RGB")


def to_phone_jpeg(picture: Image.Image) -> bytes:
    """A picture as a phone sends it: 4032x3024, JPEG quality 90 (~1 MB)."""
    buffer = io.BytesIO()
    picture.resize(PHONE, Image.Resampling.LANCZOS).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def phone_jpeg(name: str) -> bytes:
    """A real photograph (one of PHOTOS) as a phone sends it, upscaled."""
    return to_phone_jpeg(photo(name))


def png_with_alpha(width: int = 640, height: int = 480) -> bytes:
    """The photo-like image with a transparency gradient: a cut-out as design tools export it."""
    rgb = np.asarray(Image.open(io.BytesIO(photo_jpeg(width, height))))
    alpha = np.broadcast_to(np.linspace(0, 255, width, dtype=np.uint8), (height, width))[..., None]
    buffer = io.BytesIO()
    Image.fromarray(np.concatenate([rgb, alpha], axis=-1), "RGBA").save(buffer, format="PNG")
    return buffer.getvalue()


def sentence(tokens: int = TEXT_TOKENS) -> str:
    """The paragraph cut to exactly `tokens` bert-base-uncased tokens including [CLS]/[SEP]."""
    from handlers.text import load_tokenizer
    from model_store.recipes import bundled_tokenizer

    tokenizer = load_tokenizer(bundled_tokenizer().parent)
    tokenizer.no_truncation()  # the whole text, then cut here
    tokenizer.no_padding()
    text = " ".join([PARAGRAPH] * (1 + tokens // 150))  # the paragraph is ~180 tokens
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return tokenizer.decode(ids[: tokens - 2])


def tensor_request(model: Model) -> str:
    """One request of a tensor model, shaped as its file declares: seeded normal floats, zero ids."""
    settings = model.settings
    assert isinstance(settings, TensorSettings), f"{model.name} is not a tensor model"
    rng = np.random.default_rng(7)
    inputs = [
        rng.normal(size=shape).round(4) if dtype is TensorType.FLOAT32 else np.zeros(shape, dtype=dtype.value)
        for shape, dtype in zip(settings.input_shapes, settings.input_dtypes, strict=True)
    ]
    return json.dumps({"inputs": [array.tolist() for array in inputs]})


def own_sample(model: Model) -> bytes:
    """The first of the model's own samples (SAMPLES=): a request like its traffic."""
    if not model.samples:
        raise SettingsError(f"payload 'sample' needs samples of {model.name}'s own: make model ... SAMPLES=")
    return read_samples(Path(model.samples), model.task.medium)[0].data


@dataclasses.dataclass(frozen=True)
class PayloadKind:
    medium: Medium | None  # None: fits every model (one with samples)
    content_type: str
    file_name: str  # "{model}" in it: the body depends on the model
    make: Callable[[Model], bytes | str]

    def fits(self, model: Model) -> bool:
        return self.medium is model.task.medium if self.medium else bool(model.samples)

    def body(self, model: Model) -> Body:
        data = self.make(model)
        file_name = self.file_name.format(model=model.name)
        return Body(data.encode() if isinstance(data, str) else data, self.content_type, file_name)


PAYLOADS = {
    "thumbnail": PayloadKind(Medium.IMAGE, "image/jpeg", "thumbnail.jpg", lambda _: photo_jpeg(224, 168)),
    "vga": PayloadKind(Medium.IMAGE, "image/jpeg", "photo.jpg", lambda _: photo_jpeg()),
    "phone": PayloadKind(Medium.IMAGE, "image/jpeg", "phone.jpg", lambda _: phone_jpeg("skimage/data/coffee.png")),
    "png-alpha": PayloadKind(Medium.IMAGE, "image/png", "alpha.png", lambda _: png_with_alpha()),
    "short": PayloadKind(Medium.TEXT, "text/plain", "short.txt", lambda _: sentence(16)),
    "typical": PayloadKind(Medium.TEXT, "text/plain", "sentence.txt", lambda _: sentence()),
    # Four times the served max_length: the handler truncates (and says so in its answer).
    "long": PayloadKind(Medium.TEXT, "text/plain", "long.txt", lambda _: sentence(4 * TEXT_TOKENS)),
    "tensor": PayloadKind(Medium.TENSOR, "application/json", "{model}.json", tensor_request),
    # Every handler takes raw bytes: an image, UTF-8 text, a JSON document.
    "sample": PayloadKind(None, "application/octet-stream", "{model}-sample", own_sample),
}
DEFAULT_PAYLOAD = {Medium.IMAGE: "vga", Medium.TEXT: "typical", Medium.TENSOR: "tensor"}


@dataclasses.dataclass(frozen=True)
class Payload:
    """A payload written to a file, for ab."""

    name: str
    path: Path
    content_type: str


def default_payload(model: Model) -> str:
    """A model's own samples when it has them, else the usual body of its medium."""
    return "sample" if model.samples else DEFAULT_PAYLOAD[model.task.medium]


def body_for(model: Model) -> Body:
    """The default body of what a model takes."""
    return PAYLOADS[default_payload(model)].body(model)


def write_payload(name: str, model: Model, out_dir: Path) -> Payload:
    """The named body for `model` as a file for ab (written once per run directory)."""
    body = PAYLOADS[name].body(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / body.file_name
    if not path.is_file():
        path.write_bytes(body.data)
    return Payload(name, path, body.content_type)
