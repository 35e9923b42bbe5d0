import json

import pytest
import torch

from handlers.payload import InvalidInput, request_bytes, request_text
from handlers.text import encode, load_tokenizer
from model_store.recipes import minilm_dir


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(minilm_dir())


def test_encode_pads_to_fixed_length(tokenizer):
    encoded = encode(tokenizer, "hello world", max_length=16)
    ids, mask, types = encoded.inputs
    assert ids.shape == mask.shape == types.shape == (16,)
    # [CLS] hello world [SEP] then padding, bert-base-uncased ids.
    assert ids[:4].tolist() == [101, 7592, 2088, 102]
    assert mask.tolist() == [1] * 4 + [0] * 12
    assert not encoded.truncated


def test_long_text_is_truncated_and_flagged(tokenizer):
    encoded = encode(tokenizer, "word " * 1000, max_length=32)
    assert encoded.inputs[0].shape == (32,)
    assert encoded.inputs[0][-1].item() == 102  # still ends with [SEP]
    assert encoded.truncated


def test_mixed_scripts_and_emoji_are_accepted(tokenizer):
    ids = encode(tokenizer, "naïve café — Привет 你好 😀", max_length=32).inputs[0]
    assert ids.dtype == torch.int64 and ids[0].item() == 101


@pytest.mark.parametrize("max_length", [16, 128])
def test_encode_equals_transformers_bert_tokenizer(tokenizer, max_length):
    from transformers import BertTokenizerFast

    from handlers.calibration import SENTENCES

    reference = BertTokenizerFast(
        vocab_file=str(minilm_dir() / "vocab.txt"), tokenizer_file=str(minilm_dir() / "tokenizer.json")
    )
    odd = ["word " * 1000, "naïve café — Привет 你好 😀", "  A\tB\nC  ", "ÉCOLE Straße", "[CLS] [MASK]", "x" * 500]
    for text in [*SENTENCES, *odd]:
        expected = reference(
            text, padding="max_length", truncation=True, max_length=max_length, return_overflowing_tokens=True
        )
        encoded = encode(tokenizer, text, max_length)
        keys = ("input_ids", "attention_mask", "token_type_ids")
        assert [t.tolist() for t in encoded.inputs] == [expected[key][0] for key in keys], text
        assert encoded.truncated == (len(expected["input_ids"]) > 1), text


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"body": "plain text"}, "plain text"),
        ({"data": b"bytes text"}, "bytes text"),
        ({"body": bytearray(b"bytearray text")}, "bytearray text"),
        ({"body": {"text": "json text"}}, "json text"),
        ({"body": json.dumps({"text": "json as bytes"}).encode()}, "json as bytes"),
        ({"body": b"{not json, just braces}"}, "{not json, just braces}"),
    ],
)
def test_request_text_accepts_plain_and_json(request_, expected):
    assert request_text(request_) == expected


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"body": b""}, "request body is empty"),
        ({}, "request body is empty"),
        ({"body": "   \n\t"}, "empty or whitespace only"),
        ({"body": b"\xff\xfe bad"}, r"not valid UTF-8 \(byte 0"),
        ({"body": {"txt": "x"}}, r'needs a string field "text", got keys \[\'txt\'\]'),
        ({"body": [1, 2]}, "got a JSON list"),
    ],
)
def test_request_text_errors_name_the_problem(request_, message):
    with pytest.raises(InvalidInput, match=message):
        request_text(request_)


def test_request_bytes_rejects_json_objects():
    assert request_bytes({"body": b"\x89PNG"}) == b"\x89PNG"
    with pytest.raises(InvalidInput, match="expected raw bytes"):
        request_bytes({"body": {"a": 1}})
