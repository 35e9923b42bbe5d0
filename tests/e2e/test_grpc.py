"""TorchServe's gRPC inference API on the kit's server, through the kit's client (stubs generated
from TorchServe 0.12's own protos): the same answers as REST, bad input as INVALID_ARGUMENT with
the kit's message, StreamPredictions answered without costing a worker."""

from __future__ import annotations

import json

import grpc
import pytest

from bench.payloads import body_for
from client import grpc_client
from kit.models import Model
from kit.server import Server
from tests.conftest import BUNDLED_MODELS
from tests.e2e.test_serving import PROBABILITY_ATOL, post, worker_pids

pytestmark = pytest.mark.e2e

# Bodies no model can serve: not an image, or JSON without the text field (keys not ASCII).
BAD = {"resnet50": b"t\xc3\xabxt, not an image", "bert": b'{"t\xc3\xabxt": "x"}', "minilm": b'{"t\xc3\xabxt": "x"}'}
MESSAGES = {"resnet50": "not a decodable image", "bert": 'needs a string field "text"', "minilm": 'string field "text"'}


def target(server: Server) -> str:
    return f"127.0.0.1:{server.config.grpc_inference_port}"


def flat(answer) -> list[float]:
    return sorted(answer.values()) if isinstance(answer, dict) else answer


@pytest.mark.parametrize("model", BUNDLED_MODELS)
def test_grpc_answers_as_rest_does(optimized_server, model):
    body = body_for(Model.load(model))
    rest = post(optimized_server, model, body.data, body.content_type)
    assert rest.status_code == 200, rest.text
    answer = json.loads(grpc_client.predict(target(optimized_server), model, body.data))
    assert flat(answer) == pytest.approx(flat(rest.json()), abs=PROBABILITY_ATOL)


@pytest.mark.parametrize("model", BUNDLED_MODELS)
def test_bad_input_is_invalid_argument_with_the_message(optimized_server, model):
    before = worker_pids(optimized_server, model)
    with pytest.raises(grpc.RpcError) as raised:
        grpc_client.predict(target(optimized_server), model, BAD[model])
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert MESSAGES[model] in raised.value.details()
    # The same bytes over REST: 400 with the whole message in the JSON body.
    rest = post(optimized_server, model, BAD[model], "application/octet-stream")
    assert rest.status_code == 400 and MESSAGES[model] in rest.json()["message"]
    assert worker_pids(optimized_server, model) == before


@pytest.mark.parametrize("model", BUNDLED_MODELS)
def test_stream_predictions_answers_once_and_keeps_the_worker(optimized_server, model):
    before = worker_pids(optimized_server, model)
    body = body_for(Model.load(model)).data
    (streamed,) = grpc_client.stream_predict(target(optimized_server), model, body)
    single = grpc_client.predict(target(optimized_server), model, body)
    assert flat(json.loads(streamed)) == pytest.approx(flat(json.loads(single)), abs=PROBABILITY_ATOL)
    assert worker_pids(optimized_server, model) == before


def test_an_unknown_model_is_refused_by_torchserve_with_internal(optimized_server):
    # TorchServe 0.12's InferenceImpl maps ModelNotFoundException to INTERNAL, before any
    # handler runs: the kit cannot make it NOT_FOUND (docs/reliability.md).
    with pytest.raises(grpc.RpcError) as raised:
        grpc_client.predict(target(optimized_server), "no-such-model", b"x")
    assert raised.value.code() is grpc.StatusCode.INTERNAL
    assert "Model not found" in raised.value.details()
