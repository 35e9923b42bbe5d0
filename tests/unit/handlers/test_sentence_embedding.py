"""handlers/sentence_embedding.py through TorchServe's Context and handle(), with tiny BERTs."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch
from ts.context import RequestProcessor

from handlers.architectures.text import SentenceEmbedder
from handlers.sentence_embedding import SentenceEmbeddingHandler
from handlers.text import encode, load_tokenizer
from tests.unit.handlers.serving import REST_HEADERS, make_context, serve, statuses, text_handler, write_text_archive


def test_sentence_embedder_returns_unit_vectors(tmp_path, tiny_bert_config):
    torch.manual_seed(0)
    write_text_archive(tmp_path, SentenceEmbedder(tiny_bert_config).eval())
    context = make_context(tmp_path, {"architecture": "sentence-embedder", "backend": "eager", "max_length": 32})
    handler = SentenceEmbeddingHandler()
    handler.initialize(context)
    (vector,) = serve(handler, context, [{"body": "hello"}])
    assert len(vector) == tiny_bert_config.hidden_size
    assert sum(v * v for v in vector) == pytest.approx(1.0, abs=1e-5)


def test_non_ascii_input_never_reaches_the_status_phrase(tmp_path, tiny_bert_config):
    from ts.protocol.otf_message_handler import create_predict_response

    from handlers.payload import PHRASE_LIMIT

    write_text_archive(tmp_path, SentenceEmbedder(tiny_bert_config).eval())
    context = make_context(tmp_path, {"architecture": "sentence-embedder", "backend": "eager", "max_length": 32})
    handler = SentenceEmbeddingHandler()
    handler.initialize(context)
    key = "tëxt-😀-" + "ж" * 400  # the handler's 400 names the keys it got
    (response,) = serve(handler, context, [{"body": {key: "x"}}])
    code, phrase = context.get_response_status(0)
    assert code == 400 and phrase.isascii() and len(phrase) <= PHRASE_LIMIT, phrase
    assert phrase.startswith('JSON body needs a string field "text", got keys')
    assert key in response["message"]  # the detail stays in the JSON body, framed by bytes
    assert context.get_response_content_type(0) == "application/json"
    # TorchServe frames the phrase by characters and writes UTF-8: ASCII keeps the frame aligned.
    frame = create_predict_response([response], {0: "req-0"}, "", 200, context)
    assert len(phrase).to_bytes(4, "big") + phrase.encode() in frame


def test_openai_embeddings_answer_several_texts_per_request_beside_the_kits_own_path(tmp_path, tiny_bert_config):
    torch.manual_seed(0)
    model = SentenceEmbedder(tiny_bert_config).eval()
    # Batches of at most 2 rows: the 3 texts of one request and the next request's take 2 forwards.
    settings = {"architecture": "sentence-embedder", "backend": "eager", "max_length": 32}
    handler, context = text_handler(tmp_path, model, SentenceEmbeddingHandler, settings, 2)
    texts = ["one", "two more words", "and three"]
    asks = [
        ("v1/embeddings", {"input": texts, "encoding_format": "base64"}),
        ("", "hello"),
        ("v1/embeddings", {"input": []}),
        ("v1/nothing", "hello"),
        ("v1/embeddings", {"input": "hello", "dimensions": 7}),
    ]
    context.request_processor = [RequestProcessor({**REST_HEADERS, "url_path": path}) for path, _ in asks]
    context.request_ids = {i: f"req-{i}" for i in range(len(asks))}
    answers = handler.handle([{"body": body} for _, body in asks], context)
    assert statuses(context) == [200, 200, 400, 404, 400]
    # A refusal only the outputs tell (a width not served) is counted as one too.
    assert handler.stages.outcomes == {"ok": 2, "bad_input": 2, "not_found": 1}

    tokenizer = load_tokenizer(tmp_path)
    encoded = [encode(tokenizer, text, 32).inputs for text in [*texts, "hello"]]
    with torch.inference_mode():
        expected = [model(*(t[None] for t in inputs))[0] for inputs in encoded]
    data = answers[0]["data"]
    assert [d["index"] for d in data] == [0, 1, 2] and answers[0]["object"] == "list"
    for item, vector in zip(data, expected, strict=False):  # base64: float32 bytes, little-endian
        served = torch.from_numpy(np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4").copy())
        torch.testing.assert_close(served, vector, rtol=0, atol=1e-5)
    tokens = sum(int(inputs[1].sum()) for inputs in encoded[:3])  # the attention mask's ones
    assert answers[0]["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    torch.testing.assert_close(torch.tensor(answers[1]), expected[3], rtol=0, atol=1e-5)  # the kit's own shape
    assert '"input" must be a text or a non-empty list' in answers[2]["error"]["message"]  # OpenAI's error shape
    assert "no API at 'v1/nothing'" in answers[3]["message"]  # the kit's error shape
    assert f"this model answers {tiny_bert_config.hidden_size} dimensions" in answers[4]["error"]["message"]
