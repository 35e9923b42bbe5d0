"""handlers/image_classification.py through TorchServe's Context and handle(): batches with bad
requests, REST and gRPC, compiled buckets, labels, settings."""

from __future__ import annotations

import json

import pytest
import torch
from torch._dynamo.utils import counters
from ts.utils.util import PredictionException

from handlers.image import image_to_tensor
from tests.conftest import encode_image
from tests.unit.handlers.serving import GRPC_HEADERS, image_handler, serve, statuses


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
