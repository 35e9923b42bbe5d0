"""OpenAI's embeddings API on a feature-extraction model: POST /predictions/<model>/1.0/v1/embeddings.

    request = parse(body)                 # InvalidInput (a 400) naming what is wrong
    answer(request, vectors, tokens, model)

Asked:    {"input": "a text" | ["a text", ...], "model": ..., "encoding_format": "float" | "base64",
           "dimensions": N, "user": ...}
Answered: {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": ...}],
           "model": ..., "usage": {"prompt_tokens": n, "total_tokens": n}}

OpenAI's Python client asks for base64 unless told otherwise and decodes it itself: the vector's
float32 bytes, little-endian. Token-id inputs are refused by name (the kit serves text). A model's
embedding has the width it was trained with: `dimensions` is accepted only at that width.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from handlers.payload import InvalidInput

PATH = "v1/embeddings"
MAX_INPUTS = 2048  # OpenAI's own limit per request
KEYS = {"input", "model", "encoding_format", "dimensions", "user"}
ENCODINGS = ("float", "base64")


@dataclasses.dataclass(frozen=True)
class EmbeddingsRequest:
    texts: tuple[str, ...]
    base64: bool = False
    dimensions: int | None = None


def parse(body: Any) -> EmbeddingsRequest:
    if not isinstance(body, dict):
        raise InvalidInput('the body must be a JSON object with "input" (a text or a list of texts)')
    if unknown := sorted(set(body) - KEYS):
        raise InvalidInput(f"unknown parameter(s) {unknown}; this API takes {sorted(KEYS)}")
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise InvalidInput(f'"input" must be a text or a non-empty list of texts, got {type(texts).__name__}')
    if any(isinstance(text, (int, list)) for text in texts):
        raise InvalidInput('"input" as token ids is not served: send the texts')
    if len(texts) > MAX_INPUTS:
        raise InvalidInput(f'"input" has {len(texts)} texts; send at most {MAX_INPUTS} per request')
    for index, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput(f'"input"[{index}] must be a non-empty text, got {text!r}')
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise InvalidInput(f'"encoding_format" must be one of {list(ENCODINGS)}, got {encoding!r}')
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise InvalidInput(f'"dimensions" must be a positive whole number, got {dimensions!r}')
    return EmbeddingsRequest(tuple(texts), encoding == "base64", dimensions)


def encoded(vector: torch.Tensor, as_base64: bool) -> list[float] | str:
    values = vector.float()
    if as_base64:
        return base64.b64encode(values.numpy().astype("<f4").tobytes()).decode("ascii")
    return values.tolist()


def answer(request: EmbeddingsRequest, vectors: torch.Tensor, tokens: Sequence[int], model: str) -> dict[str, Any]:
    width = int(vectors.shape[-1])
    if request.dimensions is not None and request.dimensions != width:
        raise InvalidInput(f'this model answers {width} dimensions; "dimensions": {request.dimensions} is not served')
    data = [
        {"object": "embedding", "index": index, "embedding": encoded(vector, request.base64)}
        for index, vector in enumerate(vectors)
    ]
    used = sum(tokens)
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": used, "total_tokens": used}}
