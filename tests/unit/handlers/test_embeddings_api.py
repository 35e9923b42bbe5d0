"""handlers/embeddings_api.py: OpenAI's embeddings request, checked by name, and its answer's shape."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from handlers.embeddings_api import MAX_INPUTS, EmbeddingsRequest, answer, parse
from handlers.payload import InvalidInput


def test_a_text_or_a_list_of_texts_is_asked_for_in_float_or_base64():
    assert parse({"input": "a", "model": "m"}) == EmbeddingsRequest(("a",))
    assert parse({"input": ["a", "b"], "encoding_format": "base64", "user": "u"}) == EmbeddingsRequest(("a", "b"), True)
    assert parse({"input": "a", "dimensions": 384}).dimensions == 384


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("text", 'must be a JSON object with "input"'),
        ({"text": "a"}, "unknown parameter(s) ['text']"),
        ({"input": []}, '"input" must be a text or a non-empty list of texts, got list'),
        ({"input": None}, "got NoneType"),
        ({"input": [1, 2, 3]}, "as token ids is not served"),
        ({"input": [[1, 2]]}, "as token ids is not served"),
        ({"input": ["a", " "]}, '"input"[1] must be a non-empty text'),
        ({"input": ["a"] * (MAX_INPUTS + 1)}, f"send at most {MAX_INPUTS} per request"),
        ({"input": "a", "encoding_format": "int8"}, "\"encoding_format\" must be one of ['float', 'base64']"),
        ({"input": "a", "dimensions": 0}, '"dimensions" must be a positive whole number'),
        ({"input": "a", "dimensions": True}, '"dimensions" must be a positive whole number'),
    ],
)
def test_a_bad_request_is_refused_naming_what_is_wrong(body, message):
    with pytest.raises(InvalidInput) as refused:
        parse(body)
    assert message in str(refused.value)


def test_the_answer_has_openais_shape_and_base64_is_little_endian_float32():
    vectors = torch.tensor([[0.5, -1.25, 3.0], [1e-3, 0.0, -7.5]], dtype=torch.bfloat16)
    whole = answer(EmbeddingsRequest(("a", "b")), vectors, [3, 4], "m")
    assert whole["object"] == "list" and whole["model"] == "m"
    assert whole["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [d["index"] for d in whole["data"]] == [0, 1] and whole["data"][0]["object"] == "embedding"
    assert whole["data"][0]["embedding"] == [0.5, -1.25, 3.0]
    packed = answer(EmbeddingsRequest(("a", "b"), base64=True), vectors, [3, 4], "m")
    for item, vector in zip(packed["data"], vectors, strict=True):
        decoded = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        assert decoded.tolist() == vector.float().tolist()


def test_a_width_other_than_the_models_is_refused():
    vectors = torch.zeros(1, 3)
    assert answer(EmbeddingsRequest(("a",), dimensions=3), vectors, [1], "m")["data"]
    with pytest.raises(InvalidInput, match='this model answers 3 dimensions; "dimensions": 2 is not served'):
        answer(EmbeddingsRequest(("a",), dimensions=2), vectors, [1], "m")
