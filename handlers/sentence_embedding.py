"""TorchServe handler: UTF-8 text (or JSON {"text": ...}) -> unit-length embedding (MiniLM).

torch-model-archiver --handler handlers/sentence_embedding.py ...   (see model_store/build.py)
"""

from __future__ import annotations

import torch

from handlers.accuracy import Answer
from handlers.text_classification import TextClassificationHandler


class SentenceEmbeddingHandler(TextClassificationHandler):
    """Same text input path as the classifier; the model already pools and normalises."""

    answer = Answer.VALUES  # the vector itself

    def format(self, output: torch.Tensor) -> list[float]:
        return output.float().tolist()
