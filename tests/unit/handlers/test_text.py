from __future__ import annotations

import json
import logging

import pytest
import torch

from handlers.architectures.text import BertClassifier, SentenceEmbedder
from handlers.archive import bare_handler
from handlers.backends import BACKENDS, Backend
from handlers.backends.aoti import DYNAMIC_BATCH_PACKAGE
from handlers.payload import InvalidInput, request_bytes, request_text
from handlers.precompile import precompile
from handlers.sentence_embedding import SentenceEmbeddingHandler
from handlers.settings import TextSettings
from handlers.text import encode, load_tokenizer
from handlers.text_classification import TextClassificationHandler
from handlers.typed_config import SettingsError, parse_settings
from model_store.recipes import minilm_dir
from tests.unit.handlers.serving import make_context, serve, write_text_archive


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


def unpadded_eager(model, tokenizer, text: str, max_length: int) -> torch.Tensor:
    """The eager model on the text's own tokens, no padding at all."""
    ids, mask, types = encode(tokenizer, text, max_length).inputs
    length = int(mask.sum())
    with torch.inference_mode():
        return model(ids[None, :length], mask[None, :length], types[None, :length])[0]


# 5, 11, 20 and 47 tokens with [CLS] and [SEP]: one text per length bucket of (8, 16, 32, 64).
TEXTS_BY_LENGTH = {
    8: "a fine film",
    16: "a fine film with a good plot and a cast",
    32: "a fine film with a plot " * 3,
    64: "word " * 45,
}


@pytest.mark.parametrize(
    ("handler_class", "model_class", "architecture", "settings", "batch_size"),
    [
        (TextClassificationHandler, BertClassifier, "bert-classifier", {"backend": "inductor"}, 2),
        (SentenceEmbeddingHandler, SentenceEmbedder, "sentence-embedder", {"backend": "eager"}, 2),
        # The precompiled artifacts keep the length dynamic: one package, one IR for every bucket.
        (TextClassificationHandler, BertClassifier, "bert-classifier", {"backend": "aoti"}, 1),
        (SentenceEmbeddingHandler, SentenceEmbedder, "sentence-embedder", {"backend": "openvino"}, 1),
        # Batches of 2 from the one package of a text model, its batch dimension dynamic too.
        (
            SentenceEmbeddingHandler,
            SentenceEmbedder,
            "sentence-embedder",
            {"backend": "aoti", "dtype": "int8", "aoti_batch_sizes": [1, 2]},
            2,
        ),
    ],
    ids=["inductor", "eager", "aoti", "openvino", "aoti-int8"],
)
def test_text_is_padded_to_its_length_bucket_and_answers_as_unpadded(
    tmp_path, tiny_bert_config, caplog, handler_class, model_class, architecture, settings, batch_size
):
    torch.manual_seed(0)
    model = model_class(tiny_bert_config).eval()
    write_text_archive(tmp_path, model)
    settings = {"architecture": architecture, "max_length": 64, "length_buckets": [8, 16, 32], **settings}
    if BACKENDS[Backend(settings["backend"])].precompiled:
        bare = bare_handler(f"{handler_class.__module__.split('.')[-1]}.py", settings, tmp_path)
        precompile(bare, model, tmp_path, progress=print)
    if settings["backend"] == "aoti":  # one copy of the weights, whatever the batch sizes served
        assert [path.name for path in tmp_path.glob("*.pt2")] == [DYNAMIC_BATCH_PACKAGE]
    context = make_context(tmp_path, settings, batch_size)
    handler = handler_class()
    handler.initialize(context)
    tokenizer = load_tokenizer(tmp_path)
    int8 = settings.get("dtype") == "int8"
    with caplog.at_level(logging.INFO, logger="handlers.base"):
        for bucket, text in TEXTS_BY_LENGTH.items():
            tokens = int(encode(tokenizer, text, 64).inputs[1].sum())
            assert bucket // 2 < tokens <= bucket, (bucket, tokens)  # the text really belongs to this bucket
            answers = serve(handler, context, [{"body": text}])
            if batch_size == 2:  # in a batch with the shortest text: the batch takes the longer one's bucket
                answers.append(serve(handler, context, [{"body": TEXTS_BY_LENGTH[8]}, {"body": text}])[1])
            expected = unpadded_eager(model, tokenizer, text, 64)
            for answer in answers:
                if isinstance(answer, dict):  # a classifier's probabilities
                    actual, reference = torch.tensor(list(answer.values())), torch.softmax(expected, 0)
                else:
                    actual, reference = torch.tensor(answer), expected
                if int8:  # the direction of the embedding, as the int8 guard measures it
                    assert torch.nn.functional.cosine_similarity(actual, reference, dim=0) > 0.98
                else:
                    torch.testing.assert_close(actual, reference, rtol=1e-4, atol=1e-5)
            assert f"shape [{batch_size}, {bucket}]" in caplog.text
    assert "recompiled while serving" not in caplog.text


def test_length_buckets_end_at_max_length_and_need_a_mask():
    settings = parse_settings(TextSettings, {"max_length": 48, "length_buckets": [64, 16, 32]})
    assert settings.lengths == (16, 32, 48)
    assert [settings.length_for(n) for n in (1, 16, 17, 33, 48)] == [16, 16, 32, 48, 48]
    assert settings.varying_dims() == {1: (16, 48)}
    unmasked = parse_settings(TextSettings, {"input_names": ["input_ids"]})
    assert unmasked.lengths == (128,) and unmasked.varying_dims() == {}
    assert parse_settings(TextSettings, {"length_buckets": []}).lengths == (128,)
    assert parse_settings(TextSettings, {"backend": "ipex"}).lengths == (128,)  # traced at one length
    with pytest.raises(SettingsError, match="length_buckets must be lengths >= 2 tokens"):
        parse_settings(TextSettings, {"length_buckets": [1, 16]})
