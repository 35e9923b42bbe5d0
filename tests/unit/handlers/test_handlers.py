"""The handlers through TorchServe's own Context and handle(), with tiny models in tmp_path."""

from __future__ import annotations

import base64
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters
from ts.context import Context, RequestProcessor
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.utils.util import PredictionException

import handlers.itt
from handlers.architectures.text import BertClassifier, SentenceEmbedder
from handlers.archive import bare_handler
from handlers.backends import BACKENDS, Backend
from handlers.backends.aoti import DYNAMIC_BATCH_PACKAGE
from handlers.calibration import CALIBRATION_COUNT
from handlers.image import image_to_tensor
from handlers.image_classification import ImageClassificationHandler
from handlers.precompile import precompile
from handlers.sentence_embedding import SentenceEmbeddingHandler
from handlers.settings import TextSettings
from handlers.text import TOKENIZER_FILE, encode, load_tokenizer
from handlers.text_classification import TextClassificationHandler
from handlers.typed_config import SettingsError, parse_settings
from model_store.recipes import minilm_dir
from tests.conftest import encode_image

METRICS_CONFIG = Path(__import__("ts").__file__).parent / "configs" / "metrics.yaml"


def make_context(model_dir: Path, handler_settings: dict, batch_size: int = 1) -> Context:
    context = Context(
        "tiny",
        str(model_dir),
        {"model": {"modelName": "tiny"}},
        batch_size,
        None,
        "0.12.0",
        metrics=MetricsCacheYamlImpl(str(METRICS_CONFIG)),
        model_yaml_config={"handler": handler_settings},
    )
    context.metrics.initialize_cache()
    return context


# What TorchServe 0.12 hands the handler per request (ts/service.py): an entry per input field,
# and a REST request's HTTP headers; a gRPC request has no HTTP headers.
REST_HEADERS = {"body": {"content-type": "image/jpeg"}, "Host": "127.0.0.1:8080", "Content-Length": "1"}
GRPC_HEADERS = {"data": {"content-type": ""}}


def serve(handler, context: Context, requests: list[dict], headers: dict = REST_HEADERS) -> list:
    context.request_processor = [RequestProcessor(dict(headers)) for _ in requests]
    context.request_ids = {i: f"req-{i}" for i in range(len(requests))}
    return handler.handle(requests, context)


def statuses(context: Context) -> list[int]:
    return [p.get_response_status_code() for p in context.request_processor]


@pytest.fixture
def image_archive(tmp_path, tiny_cnn):
    example = torch.randn(2, 3, 224, 224)
    # A dynamic batch dimension, as a user must export it to serve batches > 1.
    program = torch.export.export(tiny_cnn, (example,), dynamic_shapes={"x": {0: torch.export.Dim("batch", max=64)}})
    torch.export.save(program, tmp_path / "model.pt2")
    return tmp_path


def image_handler(model_dir, batch_size=1, **settings):
    context = make_context(model_dir, {"architecture": "exported-program", **settings}, batch_size)
    handler = ImageClassificationHandler()
    handler.initialize(context)
    return handler, context


def test_batch_with_one_bad_request(image_archive, tiny_cnn):
    handler, context = image_handler(image_archive, batch_size=4, backend="eager", top_k=3)
    good = [encode_image("RGB", (320, 240)), encode_image("L", (100, 80))]
    responses = serve(handler, context, [{"body": good[0]}, {"body": b"garbage bytes"}, {"data": good[1]}])

    assert statuses(context) == [200, 400, 200]
    assert responses[1]["code"] == 400 and "not a decodable image" in responses[1]["message"]
    assert handler.stages.outcomes == {"ok": 2, "bad_input": 1}  # the metrics port's kit_requests_total
    for response, data in zip((responses[0], responses[2]), good, strict=True):
        with torch.inference_mode():
            expected = torch.softmax(tiny_cnn(image_to_tensor(data)[None])[0], 0)
        top = torch.topk(expected, 3)
        assert list(response) == [str(int(i)) for i in top.indices]
        assert list(response.values()) == pytest.approx(top.values.tolist(), abs=1e-5)


def test_compiled_buckets_pad_and_match_eager(image_archive, tiny_cnn):
    handler, context = image_handler(image_archive, batch_size=4, backend="inductor", top_k=10)
    assert handler.buckets == [1, 2, 4]
    images = [encode_image("RGB", (64 + i, 48)) for i in range(3)]  # 3 requests -> bucket 4
    graphs = counters["stats"]["unique_graphs"]
    responses = serve(handler, context, [{"body": data} for data in images])
    assert counters["stats"]["unique_graphs"] == graphs, "serving recompiled a warmed-up bucket"
    assert statuses(context) == [200, 200, 200]
    for response, data in zip(responses, images, strict=True):
        with torch.inference_mode():
            expected = torch.softmax(tiny_cnn(image_to_tensor(data)[None])[0], 0)
        got = torch.tensor([response[str(i)] for i in range(10)])
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_all_bad_batch_skips_the_model(image_archive):
    handler, context = image_handler(image_archive, backend="eager")
    responses = serve(handler, context, [{"body": b""}])
    assert statuses(context) == [400]
    assert responses[0]["message"] == "request body is empty"


def test_a_bad_grpc_request_fails_its_batch_with_400_for_invalid_argument(image_archive):
    # TorchServe answers gRPC with OK whatever the per-request status: only a batch-level error
    # (PredictionException) becomes a gRPC status (400 -> INVALID_ARGUMENT).
    handler, context = image_handler(image_archive, backend="eager")
    with pytest.raises(PredictionException) as raised:
        serve(handler, context, [{"data": "t\u00ebxt".encode()}], headers=GRPC_HEADERS)
    assert raised.value.error_code == 400
    assert raised.value.message.isascii() and "not a decodable image" in raised.value.message
    assert handler.stages.outcomes == {"bad_input": 1}


def test_grpc_answers_end_a_stream_and_rest_answers_do_not(image_archive):
    handler, context = image_handler(image_archive, backend="eager")
    image = encode_image("RGB", (40, 40))
    serve(handler, context, [{"data": image}], headers=GRPC_HEADERS)
    assert context.get_response_headers(0)["ts_stream_next"] == "false"
    serve(handler, context, [{"body": image}])
    assert "ts_stream_next" not in context.get_response_headers(0), "REST would switch to chunked streaming"


def test_labels_file_names_classes(image_archive):
    (image_archive / "labels.json").write_text(json.dumps([f"class-{i}" for i in range(10)]))
    handler, context = image_handler(image_archive, backend="eager", labels_file="labels.json", top_k=10)
    (response,) = serve(handler, context, [{"body": encode_image("RGB", (50, 50))}])
    assert sorted(response) == sorted(f"class-{i}" for i in range(10))


def test_unknown_setting_stops_the_worker(image_archive):
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['bakend'\]"):
        image_handler(image_archive, bakend="eager")


class RangeRecorder:
    def __init__(self):
        self.events: list[str] = []

    def install(self, monkeypatch):
        monkeypatch.setattr(handlers.itt.itt, "is_available", lambda: True)
        monkeypatch.setattr(handlers.itt.itt, "range_push", lambda name: self.events.append(f"push {name}"))
        monkeypatch.setattr(handlers.itt.itt, "range_pop", lambda: self.events.append("pop"))


def test_one_itt_range_per_inference_call(image_archive, monkeypatch):
    handler, context = image_handler(image_archive, batch_size=2, backend="eager")
    recorder = RangeRecorder()
    recorder.install(monkeypatch)
    serve(handler, context, [{"body": encode_image("RGB", (40, 40))}] * 2)
    serve(handler, context, [{"body": encode_image("RGB", (40, 40))}])
    assert recorder.events == ["push tiny:bs2", "pop", "push tiny:bs1", "pop"]


def test_itt_range_closes_when_inference_raises(image_archive, monkeypatch):
    handler, context = image_handler(image_archive, backend="eager")
    recorder = RangeRecorder()
    recorder.install(monkeypatch)

    def explode(*inputs):
        raise RuntimeError("boom")

    object.__setattr__(handler.optimized, "run", explode)  # frozen dataclass: bypass for the test
    with pytest.raises(RuntimeError, match="boom"):
        serve(handler, context, [{"body": encode_image("RGB", (40, 40))}])
    assert recorder.events == ["push tiny:bs1", "pop"]


def test_itt_switch_off_opens_no_range(image_archive, monkeypatch):
    handler, context = image_handler(image_archive, backend="eager", itt=False)
    recorder = RangeRecorder()
    recorder.install(monkeypatch)
    serve(handler, context, [{"body": encode_image("RGB", (40, 40))}])
    assert recorder.events == []


def write_text_archive(model_dir: Path, model) -> Path:
    torch.save(model.state_dict(), model_dir / "model.pt")
    (model_dir / "config.json").write_text(model.config.to_json_string())
    shutil.copy(minilm_dir() / TOKENIZER_FILE, model_dir / TOKENIZER_FILE)
    return model_dir


def text_handler(model_dir: Path, model, handler_class, settings: dict, batch_size: int = 1):
    """`model` saved as a text archive in `model_dir`, served by `handler_class`, initialized."""
    write_text_archive(model_dir, model)
    context = make_context(model_dir, settings, batch_size)
    handler = handler_class()
    handler.initialize(context)
    return handler, context


def test_text_classifier_serves_probabilities(tmp_path, tiny_bert_config):
    torch.manual_seed(0)
    model = BertClassifier(tiny_bert_config).eval()
    settings = {"architecture": "bert-classifier", "backend": "inductor", "max_length": 32}
    handler, context = text_handler(tmp_path, model, TextClassificationHandler, settings, 2)
    responses = serve(handler, context, [{"body": "a fine film"}, {"body": b"\xff bad"}, {"body": {"text": "dull"}}])
    assert statuses(context) == [200, 400, 200]
    tokenizer = load_tokenizer(tmp_path)
    for response, text in ((responses[0], "a fine film"), (responses[2], "dull")):
        inputs = tuple(t[None] for t in encode(tokenizer, text, 32).inputs)
        with torch.inference_mode():
            expected = torch.softmax(model(*inputs)[0], 0)
        assert list(response) == ["LABEL_0", "LABEL_1", "LABEL_2"]
        torch.testing.assert_close(torch.tensor(list(response.values())), expected, rtol=1e-4, atol=1e-5)


def test_text_over_the_limit_is_cut_or_refused_as_the_model_file_says(tmp_path, tiny_bert_config):
    write_text_archive(tmp_path, BertClassifier(tiny_bert_config).eval())
    long_text, short_text = " ".join(["word"] * 40), "a fine film"
    for over_length, status in (("truncate", 200), ("refuse", 400)):
        settings = {"architecture": "bert-classifier", "backend": "eager", "max_length": 16, "over_length": over_length}
        context = make_context(tmp_path, settings)
        handler = TextClassificationHandler()
        handler.initialize(context)
        (answer,) = serve(handler, context, [{"body": long_text}])
        assert statuses(context) == [status], answer
        assert status == 200 or "longer than the 16 tokens this model takes" in answer["message"]
        serve(handler, context, [{"body": short_text}])
        assert statuses(context) == [200]
        assert handler.stages.outcomes == ({"ok": 2} if status == 200 else {"too_long": 1, "ok": 1})


def test_sentence_embedder_returns_unit_vectors(tmp_path, tiny_bert_config):
    torch.manual_seed(0)
    write_text_archive(tmp_path, SentenceEmbedder(tiny_bert_config).eval())
    context = make_context(tmp_path, {"architecture": "sentence-embedder", "backend": "eager", "max_length": 32})
    handler = SentenceEmbeddingHandler()
    handler.initialize(context)
    (vector,) = serve(handler, context, [{"body": "hello"}])
    assert len(vector) == tiny_bert_config.hidden_size
    assert sum(v * v for v in vector) == pytest.approx(1.0, abs=1e-5)


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


def test_profile_switch_records_the_first_requests_only(image_archive, tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_PROFILE_REQUESTS", "2")
    monkeypatch.setenv("LOG_LOCATION", str(tmp_path / "logs"))
    handler, context = image_handler(image_archive, backend="eager")
    request = [{"body": encode_image("RGB", (40, 40))}]
    serve(handler, context, request)
    assert not (tmp_path / "logs" / "profile").exists()  # written once N calls are recorded
    serve(handler, context, request)
    (trace,) = (tmp_path / "logs" / "profile").glob("tiny-pid*.json")
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(event.get("name", "").startswith("aten::conv") for event in events)
    assert (tmp_path / "logs" / "profile" / f"{trace.stem}-top20.txt").is_file()
    serve(handler, context, request)  # after N: served as usual, nothing more recorded
    assert statuses(context) == [200] and len(list((tmp_path / "logs" / "profile").iterdir())) == 2


class OpRangeRecorder:
    entered = 0

    def __enter__(self):
        OpRangeRecorder.entered += 1

    def __exit__(self, *exc_info):
        return False


@pytest.mark.parametrize(("value", "expected"), [("1", 2), ("", 0)], ids=["on", "off"])
def test_op_level_itt_switch(image_archive, monkeypatch, value, expected):
    monkeypatch.setenv("KIT_ITT_OPS", value)
    monkeypatch.setattr(torch.autograd.profiler, "emit_itt", OpRangeRecorder)
    OpRangeRecorder.entered = 0
    handler, context = image_handler(image_archive, backend="eager")
    for _ in range(2):
        serve(handler, context, [{"body": encode_image("RGB", (40, 40))}])
    assert OpRangeRecorder.entered == expected


def test_diagnostics_switch_must_be_a_number(monkeypatch):
    from handlers.switches import Diagnostics

    with pytest.raises(ValueError, match="KIT_PROFILE_REQUESTS must be a whole number of requests, got 'ten'"):
        Diagnostics.from_environment({"KIT_PROFILE_REQUESTS": "ten"})


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


def test_status_phrase_escapes_and_bounds_text():
    from handlers.payload import PHRASE_LIMIT, status_phrase

    assert status_phrase("got keys ['tëxt']") == "got keys ['t\\xebxt']"
    assert status_phrase("line\nbreak\x00") == "line break "
    assert len(status_phrase("é" * 1000)) == PHRASE_LIMIT


@pytest.fixture
def tensor_archive(tmp_path):
    from tests.tensor_models import tabular_program

    tabular_program(tmp_path / "model.pt2")
    return tmp_path


def test_tensor_model_answers_numbers_and_refuses_bad_json_by_name(tensor_archive):
    from handlers.tensor import TensorHandler
    from model_store.exported import tensor_inputs
    from tests.tensor_models import tabular_model

    settings = tensor_inputs(tensor_archive / "model.pt2")
    assert settings == {"input_shapes": [[8], [3]], "input_dtypes": ["float32", "int64"]}
    context = make_context(tensor_archive, {"backend": "eager", **settings}, batch_size=2)
    handler = TensorHandler()
    handler.initialize(context)
    features, ids = [[0.5 * i for i in range(8)], [-1.0] * 8], [[1, 2, 3], [0, 0, 19]]
    requests = [{"body": json.dumps({"inputs": [features[i], ids[i]]}).encode()} for i in range(2)]
    answers = serve(handler, context, requests)
    expected = tabular_model()(torch.tensor(features), torch.tensor(ids))
    assert statuses(context) == [200, 200]
    torch.testing.assert_close(torch.tensor(answers), expected, atol=1e-6, rtol=0)
    bad = {
        b"\xff\xd8\xff not json": "body is not JSON",
        b"[1, 2]": 'this model takes 2 inputs: send {"inputs": [...]}',
        b'{"inputs": [[1, 2], [1, 2, 3]]}': "input 0 has shape [2]; the model takes [8]",
        json.dumps({"inputs": [features[0], [1.5, 2, 3]]}).encode(): "input 1 must hold int64 values, got non-integer",
        json.dumps({"inputs": [["a"] * 8, [1, 2, 3]]}).encode(): "input 0 must hold float32 values, got non-numbers",
        json.dumps({"inputs": [[[1], [1, 2]], [1, 2, 3]]}).encode(): "input 0 is not a rectangular array",
        b'{"features": []}': 'JSON object needs "inputs"',
    }
    for body, message in bad.items():
        answers = serve(handler, context, [{"body": body}, requests[0]])
        assert statuses(context) == [400, 200], body
        assert message in answers[0]["message"], answers[0]
        torch.testing.assert_close(torch.tensor(answers[1]), expected[0], atol=1e-6, rtol=0)


def test_a_tensor_models_synthetic_inputs_are_bodies_a_client_could_send(tensor_archive):
    from handlers.tensor import TensorHandler
    from model_store.exported import tensor_inputs

    context = make_context(tensor_archive, {"backend": "eager", **tensor_inputs(tensor_archive / "model.pt2")})
    handler = TensorHandler()
    handler.initialize(context)
    body = handler.synthetic_body(3)
    features, ids = json.loads(body)["inputs"]
    assert len(features) == 8 and ids == [0, 0, 0]  # floats for float inputs, zeros index any table
    decoded = handler.samples.synthetic(3)
    # float32 -> JSON -> float32 is exact: the decoded sample is the generator's, bit for bit.
    assert decoded[0].dtype == torch.float32 and decoded[0].tolist() == features
    samples = handler.samples
    assert torch.equal(samples.synthetic(3)[0], decoded[0]) and not torch.equal(samples.synthetic(4)[0], decoded[0])
    served = serve(handler, context, [{"body": body}])
    assert statuses(context) == [200]
    assert samples.held_out_body(0) == handler.synthetic_body(CALIBRATION_COUNT)  # no samples: synthetic ones
    assert len(samples.calibration_bodies()) == CALIBRATION_COUNT and served


def test_a_text_model_with_a_small_vocabulary_warms_up_and_answers(tmp_path, tiny_bert_config):
    # Protein, DNA and character models have 25-100 tokens: warm-up ids must stay inside them.
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = ["[PAD]", "[UNK]", *"ACDEFGHIKLMNPQRSTVWY"]  # the 20 amino acids, one token each
    tokenizer = Tokenizer(WordLevel({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tiny_bert_config.vocab_size = len(words)
    torch.manual_seed(0)
    model = BertClassifier(tiny_bert_config).eval()
    write_text_archive(tmp_path, model)
    tokenizer.save(str(tmp_path / TOKENIZER_FILE))
    context = make_context(tmp_path, {"architecture": "bert-classifier", "backend": "eager", "max_length": 32})
    handler = TextClassificationHandler()
    handler.initialize(context)
    text = "M K T A Y I A K Q R"
    (answer,) = serve(handler, context, [{"body": text}])
    assert statuses(context) == [200], answer
    inputs = tuple(t[None] for t in encode(load_tokenizer(tmp_path), text, 32).inputs)
    with torch.inference_mode():
        expected = torch.softmax(model(*inputs)[0], 0)
    torch.testing.assert_close(torch.tensor(list(answer.values())), expected, rtol=1e-4, atol=1e-5)


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
