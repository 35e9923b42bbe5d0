"""JPEG/PNG bytes -> normalized [3, crop, crop] float tensor: torchvision's ImageNet recipe by default,
or what a Hugging Face image processor says (model_store/huggingface.py derives a Preprocessing).

x = image_to_tensor(open("cat.jpg", "rb").read())                       # resize 256, crop 224, ImageNet
x = image_to_tensor(data, Preprocessing(resize=224, crop=224, fit=Fit.STRETCH, mean=(0.5,) * 3, std=(0.5,) * 3))  # ViT
"""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from handlers.payload import InvalidInput
from handlers.settings import IMAGENET_MEAN, IMAGENET_STD, Fit, Preprocessing, Resample  # noqa: F401 - re-exported

PIL_FILTERS = {r: Image.Resampling[r.name] for r in Resample}
IMAGENET = Preprocessing()  # torchvision's recipe: what the bundled image model was trained with

# 64 MP: far above any camera photo, far below what would exhaust worker memory (x3 bytes RGB).
MAX_PIXELS = 64_000_000
# A JPEG is decoded at the smallest of libjpeg's DCT scales (1/2, 1/4, 1/8) that keeps its shorter
# side at least this many times the resize target: a 12 MP phone photo at 1/4 instead of whole
# (~1/16 of the IDCT work), and the bilinear resize after it still averages >= 2 pixels per output
# pixel, as from the full image. Smaller photos (640x480 for 256) decode whole, as before.
DRAFT_MARGIN = 2


def draft_size(size: tuple[int, int], shorter_side: int) -> tuple[int, int] | None:
    """The size to ask libjpeg for (PIL's Image.draft), or None when no reduction is possible."""
    width, height = size
    scale = DRAFT_MARGIN * shorter_side / min(width, height)
    if scale >= 0.5:
        return None
    return (math.ceil(width * scale), math.ceil(height * scale))


def decode_image(data: bytes, shorter_side: int | None = None) -> Image.Image:
    """Bytes -> RGB image; with `shorter_side`, a large JPEG is decoded reduced (DRAFT_MARGIN)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size  # header only: nothing decoded yet
            if width * height > MAX_PIXELS:
                raise InvalidInput(
                    f"image too large to decode: {width}x{height} pixels, over the limit of {MAX_PIXELS}"
                )
            reduced = draft_size(image.size, shorter_side) if shorter_side and image.format == "JPEG" else None
            if reduced:
                image.draft("RGB", reduced)
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
    # Grayscale, palette, CMYK and alpha images all become 3-channel RGB (an RGB one is not copied).
    return image if image.mode == "RGB" else image.convert("RGB")


def resize_and_crop(
    image: Image.Image, size: int, crop: int, resample: Image.Resampling = Image.Resampling.BILINEAR
) -> Image.Image:
    """torchvision's Resize(size) + CenterCrop(crop), computing only the cropped pixels: PIL
    resamples the crop's box of the source straight to crop x crop (its filter still reads the
    pixels around the box, as the whole resize would). Within one 8-bit level of resizing the
    whole image and cropping it, at ~40-60 % less time (tests/unit/handlers/test_image.py)."""
    width, height = image.size
    scale = size / min(width, height)
    resized = (max(1, round(width * scale)), max(1, round(height * scale)))
    left, top = int(round((resized[0] - crop) / 2.0)), int(round((resized[1] - crop) / 2.0))
    x, y = width / resized[0], height / resized[1]  # source pixels per resized pixel
    box = (left * x, top * y, (left + crop) * x, (top + crop) * y)
    return image.resize((crop, crop), resample, box=box)


def image_to_tensor(data: bytes, preprocessing: Preprocessing = IMAGENET, reduce: bool = True) -> torch.Tensor:
    """reduce=False decodes a large JPEG whole (the reference the reduced decode is checked against)."""
    p = preprocessing
    image = decode_image(data, p.resize if reduce else None)
    if p.fit is Fit.CROP:
        return normalise(resize_and_crop(image, p.resize, p.crop, PIL_FILTERS[p.resample]), p)
    image = image.resize((p.resize, p.resize), PIL_FILTERS[p.resample])
    offset = (p.resize - p.crop) // 2  # Hugging Face's center_crop: floor on both sides
    return normalise(image.crop((offset, offset, offset + p.crop, offset + p.crop)), p)


def normalise(image: Image.Image, preprocessing: Preprocessing = IMAGENET) -> torch.Tensor:
    """RGB image -> [3, H, W] float tensor: rescaled, then the mean taken off and divided by the std.

    As x * (rescale / std) + (-mean / std) in one pass over the converted pixels (within 1e-6 of
    the three steps; half their time: each step allocated and wrote a 0.6 MB tensor)."""
    p = preprocessing
    pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1)  # [3, H, W] uint8, channels-last in memory
    scale = torch.tensor([p.rescale / std for std in p.std]).view(3, 1, 1)
    shift = torch.tensor([-mean / std for mean, std in zip(p.mean, p.std, strict=True)]).view(3, 1, 1)
    return torch.addcmul(shift, pixels.to(torch.float32), scale)
