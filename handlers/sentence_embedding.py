"""TorchServe handler: UTF-8 text (or JSON {"text": ...}) -> unit-length embedding (MiniLM), and
OpenAI's embeddings API at .../v1/embeddings (handlers/embeddings_api.py).

torch-model-archiver --handler handlers/sentence_embedding.py ...   (see model_store/build.py)
"""

from __future__ import annotations

from typing import Any

import torch

from handlers import embeddings_api, openai_shapes
from handlers.accuracy import Answer
from handlers.base import Decoded
from handlers.payload import InvalidInput, request_json
from handlers.text_classification import TextClassificationHandler


class SentenceEmbeddingHandler(TextClassificationHandler):
    """Same text input path as the classifier; the model already pools and normalises."""

    answer = Answer.VALUES  # the vector itself

    def format(self, output: torch.Tensor) -> list[float]:
        return output.float().tolist()

    # -- OpenAI's embeddings: several texts per request, its shapes ---------------------------
    def decode_request(self, request: dict[str, Any], path: str) -> Decoded:
        if path != embeddings_api.PATH:
            return super().decode_request(request, path)
        asked = embeddings_api.parse(request_json(request))
        rows = []
        for index, text in enumerate(asked.texts):
            try:
                rows.append(self.encode_text(text))
            except InvalidInput as error:
                raise type(error)(f'"input"[{index}]: {error}') from None
        return Decoded(rows, asked)

    def reply(self, request: Decoded, outputs: torch.Tensor, path: str) -> Any:
        if path != embeddings_api.PATH:
            return super().reply(request, outputs, path)
        tokens = [self.tokens(row) for row in request.rows]
        return embeddings_api.answer(request.asked, outputs, tokens, self.model_name)

    def refusal(self, error: InvalidInput, path: str) -> Any:
        if path != embeddings_api.PATH:
            return super().refusal(error, path)
        return openai_shapes.error_body(str(error), error.code)
