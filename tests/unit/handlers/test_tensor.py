"""handlers/tensor.py: a torch.export program served as JSON numbers in and out."""

from __future__ import annotations

import json

import pytest
import torch

from handlers.calibration import CALIBRATION_COUNT
from tests.unit.handlers.serving import make_context, serve, statuses


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
