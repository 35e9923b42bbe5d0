"""Every int8 and bf16 variant `make test-archives` installs, served by a real TorchServe over
HTTP, answers within the accuracy guard's tolerance of float32 eager on every input the build
gave it: the held-out bodies it was judged on and the calibration ones it was tuned on.

The check is the guard's own metric (handlers/accuracy.py) on what a client receives: for a
classifier the probabilities it is sent (a changed top-1 counts as eager's margin between the
two classes), for an embedder the vector (||served - eager|| / ||eager||). The tolerance is the
served archive's own (its dtype's TOLERANCES entry, or the model file's accuracy_tolerance).
"""

from __future__ import annotations

import dataclasses

import pytest
import requests
import torch

from handlers.accuracy import Answer, relative_errors, tolerance
from handlers.archive import archived_settings, load_archived
from handlers.base import OptimizedHandler
from handlers.labels import Labels
from handlers.precompile import HELD_OUT_SYNTHETIC
from kit.serve_config import ServeConfig
from kit.server import Server
from kit.variant import Variant
from tests.conftest import BUNDLED_MODELS
from tests.e2e.conftest import one_cpu, start_server

pytestmark = pytest.mark.e2e

# What `make test-archives` builds of each quantized variant (bf16 only where the CPU computes it).
INSTALLED = {
    "openvino-int8": BUNDLED_MODELS,
    "aoti-int8": ["resnet50", "minilm"],
    "openvino-bf16": ["resnet50", "minilm"],
}


def served_probability_error(served: dict[str, float], expected: torch.Tensor, labels: Labels) -> float:
    """The guard's probability error on the classes a client is sent (a classifier may send only
    its top k: the others are below the k-th sent probability in both answers' order)."""
    eager = expected.float().softmax(0)
    names = [labels.name(i) for i in range(eager.numel())]
    indices = [names.index(label) for label in served]
    sent = torch.tensor(list(served.values()))
    difference = (sent - eager[indices]).abs().max().item()
    served_top = indices[int(sent.argmax())]  # a classifier may send its classes in index order
    flip_margin = (eager.max() - eager[served_top]).item()  # eager's own top-1 against the served one
    return max(difference, flip_margin)


def served_error(handler: OptimizedHandler, served, expected: torch.Tensor) -> float:
    if handler.answer is Answer.PROBABILITIES:
        return served_probability_error(served, expected, handler.labels)
    return relative_errors(torch.tensor(served).reshape(expected.shape)[None], expected[None]).item()


def post(server: Server, model: str, body: bytes):
    response = requests.post(
        server.api.url("inference", f"/predictions/{model}"),
        data=body,
        headers={"Content-Type": "application/octet-stream", **server.api.headers("inference")},
        timeout=60,
    )
    assert response.status_code == 200, f"{model}: {response.status_code} {response.text}"
    return response.json()


@pytest.mark.parametrize("variant", sorted(INSTALLED))
def test_every_installed_quantized_variant_answers_within_its_tolerance(variant, tmp_path):
    if reason := Variant.load(variant).refusal():
        pytest.skip(f"{variant} is not built on this CPU: {reason}")
    models = INSTALLED[variant]
    server = start_server(
        tmp_path / "run", ServeConfig.from_preset("optimized", variant=variant, models=models, cpus=one_cpu())
    )
    try:
        verdicts = [served_verdict(server, model, variant) for model in models]
        report = "; ".join(map(str, verdicts))
        print(f"[served accuracy] {variant}: {report}")  # pytest -s shows it: the numbers docs/backends.md quotes
        assert all(v.over == 0 for v in verdicts), f"{variant}: {report}"
        assert all(v.count >= HELD_OUT_SYNTHETIC for v in verdicts), report
    finally:
        server.stop()


@dataclasses.dataclass(frozen=True)
class Verdict:
    model: str
    count: int  # answers judged
    worst: float
    over: int  # answers over the tolerance
    limit: float

    def __str__(self) -> str:
        return f"{self.model}: {self.count} answers, worst {self.worst:.3g}, {self.over} over {self.limit:.3g}"


def served_verdict(server: Server, model: str, variant: str) -> Verdict:
    """The served variant's answers on every body its build judged or calibrated on, against the
    model's eager archive (built beside it) by the archive's own metric and tolerance."""
    eager = load_archived(Variant.load("eager").archive(model))
    handler = eager.handler
    limit = tolerance(archived_settings(Variant.load(variant).archive(model)), handler.answer)
    samples = handler.samples
    bodies = [samples.held_out_body(i) for i in range(HELD_OUT_SYNTHETIC)] + samples.calibration_bodies()
    errors = []
    with torch.inference_mode():
        for body in bodies:
            expected = eager.model(*handler.collate([handler.decode({"body": body})], 1))[0]
            errors.append(served_error(handler, post(server, model, body), expected))
    over = sum(1 for error in errors if not error <= limit)  # NaN fails
    return Verdict(model, len(errors), max(errors), over, limit)


def test_the_served_probability_error_is_the_guards_metric():
    # Two classes sent in index order, and five of many sent in probability order.
    labels = Labels(prefix="LABEL_")
    logits = torch.tensor([0.2, 0.9])
    eager = logits.softmax(0)
    same = {"LABEL_0": float(eager[0]), "LABEL_1": float(eager[1])}
    assert served_probability_error(same, logits, labels) == pytest.approx(0.0, abs=1e-7)
    flipped = {"LABEL_0": 0.55, "LABEL_1": 0.45}  # top-1 changed: eager's margin counts
    margin = float(eager[1] - eager[0])
    assert served_probability_error(flipped, logits, labels) == pytest.approx(max(margin, abs(0.55 - eager[0])))
    many = torch.arange(10.0)
    top5 = {f"LABEL_{i}": float(many.softmax(0)[i]) for i in (9, 8, 7, 6, 5)}
    assert served_probability_error(top5, many, labels) == pytest.approx(0.0, abs=1e-7)
    accuracy = relative_errors(torch.tensor([[1.1, 0.0]]), torch.tensor([[1.0, 0.0]]))
    assert accuracy.item() == pytest.approx(0.1)  # an embedder's error sees scale
