"""Generated request bodies for the fuzz suite (tests/e2e/test_fuzz.py): a fixed seed replays a run.

    cases = fuzz_cases(random.Random(seed), count=60)   # [FuzzCase(kind, body, content_type, fields)]

Kinds: random bytes; images of every format Pillow writes, truncated or with bytes flipped;
tiny, huge and lying dimensions; JSON with odd keys, values and nesting; text from every Unicode
plane, control characters, invalid UTF-8; wrong content types; multipart with odd field names.
"""

from __future__ import annotations

import dataclasses
import io
import json
import random
import struct
import zlib
from collections.abc import Callable

from PIL import Image

FORMATS = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP", "PPM", "ICO", "TGA")
# One code point from each Unicode plane in use, surrogates and private use included.
PLANES = (0x41, 0xE9, 0x416, 0x4E2D, 0xFFFD, 0x1F600, 0x20000, 0x30000, 0xE0041, 0xF0000, 0x10FFFD)
CONTROL = "".join(chr(c) for c in (*range(0, 32), 127, 0x85, 0x2028, 0x2029, 0x200B, 0xFEFF))
CONTENT_TYPES = (
    "application/octet-stream",
    "image/jpeg",
    "image/png",
    "text/plain",
    "text/plain; charset=latin-1",
    "application/json",
    "application/xml",
    "text/html",
    "",
    "application/x-www-form-urlencoded",
)


@dataclasses.dataclass(frozen=True)
class FuzzCase:
    kind: str
    body: bytes
    content_type: str  # REST only
    field: str = "data"  # the multipart field, and the gRPC input map's key


def image(rng: random.Random, fmt: str, size: tuple[int, int] | None = None) -> bytes:
    size = size or (rng.randint(1, 64), rng.randint(1, 64))
    mode = "RGBA" if fmt in ("PNG", "WEBP", "TGA") and rng.random() < 0.5 else "RGB"
    picture = Image.new(mode, size, tuple(rng.randrange(256) for _ in mode))
    out = io.BytesIO()
    picture.save(out, fmt)
    return out.getvalue()


def random_bytes(rng: random.Random) -> FuzzCase:
    return FuzzCase("random-bytes", rng.randbytes(rng.choice((1, 7, 100, 4096))), rng.choice(CONTENT_TYPES))


def truncated_image(rng: random.Random) -> FuzzCase:
    fmt = rng.choice(FORMATS)
    data = image(rng, fmt)
    return FuzzCase(f"truncated-{fmt.lower()}", data[: rng.randint(1, max(1, len(data) - 1))], "image/jpeg")


def corrupt_image(rng: random.Random) -> FuzzCase:
    fmt = rng.choice(FORMATS)
    data = bytearray(image(rng, fmt))
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return FuzzCase(f"corrupt-{fmt.lower()}", bytes(data), "application/octet-stream")


def lying_png(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height over a few bytes of data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
        + chunk(b"IEND", b"")
    )


def odd_dimensions(rng: random.Random) -> FuzzCase:
    choice = rng.randrange(3)
    if choice == 0:
        size = rng.choice(((1, 1), (1, 4000), (4000, 1), (2, 3)))
        return FuzzCase(f"image-{size[0]}x{size[1]}", image(rng, rng.choice(("PNG", "JPEG")), size), "image/png")
    if choice == 1:
        side = rng.choice((2**16, 2**20, 2**31 - 1))
        return FuzzCase(f"png-claims-{side}x{side}", lying_png(side, side), "image/png")
    return FuzzCase("png-claims-0x0", lying_png(0, 0), "image/png")


def odd_text(rng: random.Random) -> str:
    parts = [chr(rng.choice(PLANES)) * rng.randint(1, 5), rng.choice(CONTROL) * rng.randint(1, 3), "word"]
    rng.shuffle(parts)
    return "".join(parts) * rng.randint(1, 200)


def text(rng: random.Random) -> FuzzCase:
    return FuzzCase("text-unicode-planes", odd_text(rng).encode("utf-8"), rng.choice(("text/plain", "")))


def invalid_utf8(rng: random.Random) -> FuzzCase:
    bad = rng.choice((b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"))
    return FuzzCase("invalid-utf8", b"ok " + bad + b" text", rng.choice(("text/plain", "application/json")))


def nested(rng: random.Random, depth: int) -> object:
    value: object = odd_text(rng)[:20]
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {odd_text(rng)[:5]: value}
    return value


def odd_json(rng: random.Random) -> FuzzCase:
    values = [None, True, 1e308, -(2**70), [], {}, "", " ", odd_text(rng), nested(rng, 50), ["text"], 0]
    document = {odd_text(rng)[:10]: rng.choice(values) for _ in range(rng.randint(0, 4))}
    if rng.random() < 0.5:
        document["text"] = rng.choice(values)
    if rng.random() < 0.2:
        return FuzzCase("json-deep", ("[" * 5000 + "]" * 5000).encode(), "application/json")
    return FuzzCase("json-odd", json.dumps(document, ensure_ascii=rng.random() < 0.5).encode(), "application/json")


def multipart(rng: random.Random) -> FuzzCase:
    field = rng.choice(("data", "body", "", "\u00ebl\u00e9ment", "x" * 300, "a b", "file\r\nX-Injected: 1", "😀"))
    payload = rng.choice((b"", b"a sentence", rng.randbytes(64), image(rng, "PNG")))
    return FuzzCase("multipart-field", payload, "multipart/form-data", field)


GENERATORS: tuple[Callable[[random.Random], FuzzCase], ...] = (
    random_bytes,
    truncated_image,
    corrupt_image,
    odd_dimensions,
    text,
    invalid_utf8,
    odd_json,
    multipart,
)


def fuzz_cases(rng: random.Random, count: int) -> list[FuzzCase]:
    """`count` cases cycling through every generator, so each kind appears in a run."""
    return [GENERATORS[i % len(GENERATORS)](rng) for i in range(count)]
