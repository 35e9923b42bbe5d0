"""TorchServe 0.12's gRPC inference API, through the stubs `make install` generates from the
protos in its frontend jar (client/grpc_stubs/, not committed).

    body = predict("127.0.0.1:7070", "bert", b"a great movie")       # raises grpc.RpcError
    messages = stream_predict("127.0.0.1:7070", "bert", b"a great movie")

Bad input is refused with INVALID_ARGUMENT and the kit's message (see docs/reliability.md).
"""

from __future__ import annotations

import grpc
from google.protobuf import empty_pb2

try:
    from client.grpc_stubs import inference_pb2, inference_pb2_grpc
except ImportError as error:  # pragma: no cover - depends on the install
    raise ImportError("gRPC stubs missing in client/grpc_stubs: run `make install`") from error

TIMEOUT_S = 60


def stub(target: str) -> inference_pb2_grpc.InferenceAPIsServiceStub:
    return inference_pb2_grpc.InferenceAPIsServiceStub(grpc.insecure_channel(target))


def request(model: str, body: bytes) -> inference_pb2.PredictionsRequest:
    # TorchServe hands the map's entries to the handler as the request's fields: "data" as REST does.
    return inference_pb2.PredictionsRequest(model_name=model, input={"data": body})


def predict(target: str, model: str, body: bytes, timeout: float = TIMEOUT_S) -> bytes:
    return stub(target).Predictions(request(model, body), timeout=timeout).prediction


def stream_predict(target: str, model: str, body: bytes, timeout: float = TIMEOUT_S) -> list[bytes]:
    return [m.prediction for m in stub(target).StreamPredictions(request(model, body), timeout=timeout)]


def ping(target: str, timeout: float = 10) -> str:
    return stub(target).Ping(empty_pb2.Empty(), timeout=timeout).health
