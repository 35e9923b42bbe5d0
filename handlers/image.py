"""JPEG/PNG bytes -> normalized [3, crop, crop] float tensor, the torchvision ImageNet recipe.

x = image_to_tensor(open("cat.jpg", "rb").read(), resize=256, crop=224)
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from handlers.payload import InvalidInput

IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
# 64 MP: far above any camera photo, far below what would exhaust worker memory (x3 bytes RGB).
MAX_PIXELS = 64_000_000


def decode_image(data: bytes) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size  # header only: nothing decoded yet
            if width * height > MAX_PIXELS:
                raise InvalidInput(
                    f"image too large to decode: {width}x{height} pixels, over the limit of {MAX_PIXELS}"
                )
            image.load()
    except InvalidInput:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        # PIL's own guard fires in open() above twice its limit; same answer, its figures.
        raise InvalidInput(f"image too large to decode (decompression bomb guard): {error}") from None
    except UnidentifiedImageError:
        raise InvalidInput(
            f"body is not a decodable image (JPEG or PNG expected); got {len(data)} bytes starting {data[:8]!r}"
        ) from None
    except Exception as error:  # noqa: BLE001 - PIL raises many types for corrupt data
        raise InvalidInput(f"body is not a decodable image (JPEG or PNG expected): {error}") from None
    # Grayscale, palette, CMYK and alpha images all become 3-channel RGB.
    return image.convert("RGB")


def resize_shorter_side(image: Image.Image, size: int) -> Image.Image:
    width, height = image.size
    scale = size / min(width, height)
    new_size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return image.resize(new_size, Image.Resampling.BILINEAR)


def center_crop(image: Image.Image, size: int) -> Image.Image:
    width, height = image.size
    left = int(round((width - size) / 2.0))
    top = int(round((height - size) / 2.0))
    return image.crop((left, top, left + size, top + size))


def image_to_tensor(data: bytes, resize: int, crop: int) -> torch.Tensor:
    image = center_crop(resize_shorter_side(decode_image(data), resize), crop)
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0)  # [H, W, 3]
    return (pixels.permute(2, 0, 1) - IMAGENET_MEAN) / IMAGENET_STD  # [3, H, W]
