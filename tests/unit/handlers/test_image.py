import io

import numpy as np
import pytest
import torch
from PIL import Image

from bench.payloads import PHOTOS, phone_jpeg, photo_jpeg
from handlers.image import IMAGENET_MEAN, IMAGENET_STD, MAX_PIXELS, image_to_tensor, resize_and_crop
from handlers.payload import InvalidInput
from tests.conftest import encode_image

MEAN, STD = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)


def test_jpeg_becomes_normalized_crop(jpeg_bytes):
    x = image_to_tensor(jpeg_bytes)
    assert x.shape == (3, 224, 224)
    assert x.dtype == torch.float32


def test_normalization_is_imagenet():
    # A flat colour survives resize/crop exactly (PNG: lossless), so each channel is a known constant.
    x = image_to_tensor(encode_image("RGB", (300, 200), "PNG", color=(255, 128, 0)))
    expected = (torch.tensor([255, 128, 0]).view(3, 1, 1) / 255.0 - MEAN) / STD
    torch.testing.assert_close(x, expected.expand(3, 224, 224), rtol=0, atol=1e-6)


def test_shorter_side_resize_then_center_crop():
    # Left half black, right half white, 400x200: after resize to 512x256 and a 224 centre crop,
    # the centre column is the boundary, and the crop keeps both halves equally.
    image = Image.new("RGB", (400, 200), (0, 0, 0))
    image.paste((255, 255, 255), (200, 0, 400, 200))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    x = image_to_tensor(buffer.getvalue())
    white = (1.0 - MEAN[0, 0, 0]) / STD[0, 0, 0]
    black = (0.0 - MEAN[0, 0, 0]) / STD[0, 0, 0]
    assert torch.isclose(x[0, 112, 0], black, atol=1e-5)
    assert torch.isclose(x[0, 112, 223], white, atol=1e-5)


def resize_then_crop(image, size: int, crop: int):
    """The reference: torchvision's recipe done literally, the whole image resized, then cropped."""
    width, height = image.size
    scale = size / min(width, height)
    resized = image.resize((max(1, round(width * scale)), max(1, round(height * scale))), Image.Resampling.BILINEAR)
    left, top = int(round((resized.width - crop) / 2.0)), int(round((resized.height - crop) / 2.0))
    return resized.crop((left, top, left + crop, top + crop))


@pytest.mark.parametrize("size", [(640, 480), (480, 640), (224, 168), (1008, 756), (257, 256), (97, 31), (1, 1)])
def test_resizing_only_the_crop_equals_resizing_the_whole_image(size):
    image = Image.open(io.BytesIO(photo_jpeg(*size)))
    ours = np.asarray(resize_and_crop(image, 256, 224), dtype=np.int16)
    reference = np.asarray(resize_then_crop(image, 256, 224), dtype=np.int16)
    assert ours.shape == reference.shape == (224, 224, 3)
    assert np.abs(ours - reference).max() <= 1  # one 8-bit level: float rounding in PIL's filter


@pytest.mark.parametrize(
    ("mode", "fmt"),
    [("L", "JPEG"), ("CMYK", "JPEG"), ("RGBA", "PNG"), ("RGB", "PNG")],
    ids=["gray", "cmyk", "rgba", "png"],
)
def test_other_colour_modes_are_converted(mode, fmt):
    assert image_to_tensor(encode_image(mode, (64, 48), fmt)).shape == (3, 224, 224)


def test_one_pixel_image_is_served():
    assert image_to_tensor(encode_image("RGB", (1, 1), "PNG")).shape == (3, 224, 224)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x01garbage" * 50, "not a decodable image"),
        (b"plain text, not an image", "not a decodable image"),
    ],
)
def test_garbage_is_invalid_input(data, message):
    with pytest.raises(InvalidInput, match=message):
        image_to_tensor(data)


def test_truncated_jpeg_is_invalid_input(jpeg_bytes):
    with pytest.raises(InvalidInput, match="not a decodable image"):
        image_to_tensor(jpeg_bytes[: len(jpeg_bytes) // 2])


def test_decompression_bomb_is_refused_before_decoding(monkeypatch):
    # 20000x20000 of one colour: a few hundred KB as PNG, 400 MB once decoded.
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # PIL's own guard off: the kit's must catch it
    bomb = encode_image("L", (20000, 20000), "PNG", color=0)
    assert len(bomb) < 2_000_000
    with pytest.raises(InvalidInput, match=f"too large to decode: 20000x20000 pixels, over the limit of {MAX_PIXELS}"):
        image_to_tensor(bomb)


def test_pil_bomb_guard_gives_the_same_answer():
    # With PIL's default guard on, open() refuses 400 MP itself (over 2x its limit).
    with pytest.raises(InvalidInput, match="too large to decode .*400000000 pixels"):
        image_to_tensor(encode_image("L", (20000, 20000), "PNG", color=0))


def test_a_phone_photo_is_decoded_at_a_quarter_and_a_small_one_whole():
    from handlers.image import decode_image

    assert decode_image(phone_jpeg("skimage/data/chelsea.png"), 256).size == (1008, 756)  # 1/4: shorter side >= 2 x 256
    assert decode_image(encode_image("RGB", (640, 480), "JPEG"), 256).size == (640, 480)
    assert decode_image(encode_image("RGB", (4032, 3024), "PNG"), 256).size == (4032, 3024), "PNG: no DCT"


def test_reduced_decoding_stays_close_to_the_whole_decode_in_pixels():
    # Within 0.01 (mean) of the whole decode after normalisation, about 0.6/255.
    for name in PHOTOS:
        data = phone_jpeg(name)
        difference = (image_to_tensor(data) - image_to_tensor(data, reduce=False)).abs()
        assert difference.mean() < 0.01 and difference.max() < 0.25, f"{name}: {difference.mean():.4f}"


def test_reduced_decoding_keeps_a_real_classifiers_answers():
    # EfficientNet-Lite0 with ImageNet weights on 33 centred framings of 11 real photographs as
    # 12 MP JPEGs. Every decisive answer of the whole decode (top-1 ahead by >= 0.05) is kept; a
    # view that changes is a near-tie, as under the noise floor (the whole decode resized bicubic)
    # that changes more (measured: 1 of 33 changed, margin 0.006; the floor 4, margin 0.009).
    from bench.studies.photo_agreement import compare, phone_views

    reduced, floor, _ = compare(phone_views(centred_only=True))
    assert reduced.views == 33 and reduced.decisive_views >= 20
    assert reduced.decisive_top1 == 1.0
    assert reduced.largest_flipped_margin < 0.02
    assert reduced.top1 >= floor.top1
    assert reduced.max_probability_difference < 0.1
