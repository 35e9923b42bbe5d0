"""The fuzz suite: generated bodies (tests/fuzz.py) for every model over REST and gRPC. Each gets
an answer within the deadline: served (200 / OK) or refused with a 4xx naming the problem
(INVALID_ARGUMENT over gRPC); afterwards every worker is the same process and every model serves.

Replay a run with the seed it printed: FUZZ_SEED=N make test PYTEST_ARGS="-k fuzz".
"""

from __future__ import annotations

import collections
import os
import random
import time

import grpc
import pytest
import requests

from client import grpc_client
from tests.conftest import BUNDLED_MODELS
from tests.e2e.test_bad_input import assert_still_served_by
from tests.e2e.test_serving import worker_pids
from tests.fuzz import FuzzCase, fuzz_cases

pytestmark = pytest.mark.e2e

CASES_PER_MODEL = int(os.environ.get("FUZZ_CASES", "48"))  # per protocol
DEADLINE_S = 30
SERVED = {200}
REFUSED = {400, 413}
GRPC_REFUSED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
# TorchServe's frontend decodes a body sent as a form (urlencoded or multipart) itself, before
# any worker sees it, and answers 500 when it is not a well-formed one (an empty field name, a
# JPEG as urlencoded): the one refusal the kit cannot turn into a 400 (docs/reliability.md).
FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")
FRONTEND_FORM_ERROR = (500, "ErrorDataDecoderException")


@pytest.fixture(scope="module")
def seed() -> int:
    return int(os.environ.get("FUZZ_SEED") or time.time_ns() % 2**32)


def report(capsys, line: str) -> None:
    with capsys.disabled():  # in make test's output, not only in a failure's
        print(f"\n[fuzz] {line}", flush=True)


def multipart(case: FuzzCase) -> tuple[bytes, str]:
    # Built by hand: field names a client library would refuse are exactly the point.
    boundary = "kitfuzzboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{case.field}"; filename="f"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    )
    return head.encode("utf-8", "surrogatepass") + case.body + f"\r\n--{boundary}--\r\n".encode(), (
        f"multipart/form-data; boundary={boundary}"
    )


def rest_outcome(server, model: str, case: FuzzCase) -> str:
    body, content_type = (
        multipart(case) if case.content_type == "multipart/form-data" else (case.body, case.content_type)
    )
    response = requests.post(
        server.api.url("inference", f"/predictions/{model}"),
        data=body,
        headers={"Content-Type": content_type, **server.api.headers("inference")},
        timeout=DEADLINE_S,
    )
    if case.content_type in FORMS and response.status_code == FRONTEND_FORM_ERROR[0]:
        assert response.json()["type"] == FRONTEND_FORM_ERROR[1], response.text[:300]
        return "500 (frontend form decoding)"
    assert response.status_code in SERVED | REFUSED, f"{case.kind}: {response.status_code} {response.text[:300]}"
    if response.status_code in REFUSED:
        assert response.json()["message"], f"{case.kind}: a refusal must name the problem"
    return str(response.status_code)


def grpc_outcome(server, model: str, case: FuzzCase) -> str:
    stub = grpc_client.stub(f"127.0.0.1:{server.config.grpc_inference_port}")
    request = grpc_client.inference_pb2.PredictionsRequest(model_name=model, input={case.field: case.body})
    try:
        stub.Predictions(request, timeout=DEADLINE_S)
        return "OK"
    except grpc.RpcError as error:
        assert error.code() in GRPC_REFUSED, f"{case.kind}: {error.code().name} {error.details()[:300]}"
        assert error.details(), f"{case.kind}: a refusal must name the problem"
        return error.code().name


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_generated_bodies_cost_at_most_their_own_answer(optimized_server, seed, protocol, capsys):
    report(capsys, f"{protocol}: seed {seed}; replay with FUZZ_SEED={seed} make test PYTEST_ARGS='-k fuzz'")
    outcome = rest_outcome if protocol == "rest" else grpc_outcome
    rng = random.Random(f"{seed}-{protocol}")
    pids = {model: worker_pids(optimized_server, model) for model in BUNDLED_MODELS}
    tally: collections.Counter = collections.Counter()
    for model in BUNDLED_MODELS:
        for case in fuzz_cases(rng, CASES_PER_MODEL):
            started = time.monotonic()
            result = outcome(optimized_server, model, case)
            assert time.monotonic() - started < DEADLINE_S, f"{model} {case.kind}: no answer in {DEADLINE_S}s"
            tally[result] += 1
    report(capsys, f"{protocol}: {sum(tally.values())} cases over {len(BUNDLED_MODELS)} models: {dict(tally)}")
    for model in BUNDLED_MODELS:
        assert_still_served_by(optimized_server, model, pids[model])
