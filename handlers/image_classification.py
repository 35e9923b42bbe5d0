"""TorchServe handler: image bytes -> top-k {class: probability} (ResNet-50 or any image classifier).

torch-model-archiver --handler handlers/image_classification.py ...   (see model_store/build.py)
"""

from __future__ import annotations

from typing import Any

import torch

from handlers.accuracy import Answer
from handlers.backends.common import Inputs
from handlers.base import OptimizedHandler
from handlers.calibration import synthetic_photo
from handlers.image import image_to_tensor
from handlers.labels import Labels
from handlers.payload import request_bytes
from handlers.settings import ImageSettings


class ImageClassificationHandler(OptimizedHandler):
    settings_class = ImageSettings
    answer = Answer.PROBABILITIES

    def setup(self, model_dir: str) -> None:
        self.labels = Labels.load(model_dir, self.settings.labels_file)

    def decode(self, request: dict[str, Any]) -> Inputs:
        reduce = not self.diagnostics.whole_jpeg_decode
        return (image_to_tensor(request_bytes(request), self.settings.preprocessing, reduce),)

    def example(self, batch_size: int) -> Inputs:
        return (torch.randn(batch_size, 3, self.settings.crop, self.settings.crop),)

    def synthetic_body(self, index: int) -> bytes:
        return synthetic_photo(index)

    def format(self, output: torch.Tensor) -> dict[str, float]:
        probabilities = torch.softmax(output.float(), dim=0)
        top = torch.topk(probabilities, min(self.settings.top_k, probabilities.numel()))
        return {self.labels.name(int(i)): float(p) for p, i in zip(top.values, top.indices, strict=False)}
