"""Every bad request of the reliability issue against the real server: a 4xx naming the
problem, the same worker processes answering the next valid request; odd but valid input
(alpha, grayscale, CMYK, 1x1, very long or multilingual text) is served.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time

import pytest
import requests
import torch

from bench.payloads import photo_jpeg
from kit.serve_config import ServeConfig
from kit.server import Server
from tests.conftest import encode_image
from tests.e2e.conftest import one_cpu, start_server
from tests.e2e.test_serving import EMBEDDING_ATOL, post, worker_pids

pytestmark = pytest.mark.e2e

SENTENCE = b"a perfectly normal sentence"
# Peak RSS a worker may gain from a refused bomb; decoding it would take 400 MB (1.2 GB as RGB).
BOMB_PEAK_GROWTH_MB = 100


@functools.cache
def bomb_png() -> bytes:
    # 20000 x 20000 of one grey: ~400 KB on the wire.
    return encode_image("L", (20000, 20000), "PNG", color=0)


def valid_request(model: str) -> tuple[bytes, str]:
    return (photo_jpeg(), "image/jpeg") if model == "resnet50" else (SENTENCE, "text/plain")


def assert_still_served_by(server: Server, model: str, pids: set[int]) -> None:
    body, content_type = valid_request(model)
    response = post(server, model, body, content_type)
    assert response.status_code == 200, response.text
    assert worker_pids(server, model) == pids, "a worker process was replaced"


REFUSED = {
    "image-empty": ("resnet50", b"", "image/jpeg", "request body is empty"),
    "image-random-bytes": ("resnet50", bytes(range(256)) * 4, "application/octet-stream", "not a decodable image"),
    "image-truncated-jpeg": ("resnet50", None, "image/jpeg", "not a decodable image"),
    "image-text-file": ("resnet50", b"just some notes\nin a text file\n", "text/plain", "not a decodable image"),
    "image-bomb": ("resnet50", None, "image/png", "too large to decode"),
    "text-empty": ("bert", b"", "text/plain", "request body is empty"),
    "text-whitespace": ("bert", b" \n\t  ", "text/plain", "empty or whitespace only"),
    "text-invalid-utf8": ("bert", b"\xff\xfe\xfd invalid", "text/plain", "not valid UTF-8"),
    "json-wrong-field": ("minilm", b'{"sentence": "x"}', "application/json", 'needs a string field \\"text\\"'),
    "json-empty-text": ("minilm", b'{"text": ""}', "application/json", "empty or whitespace only"),
    # Keys echoed in the 400: non-ASCII text in TorchServe's status frame cost a worker (issue 15).
    "json-non-ascii-keys": ("bert", '{"tëxt": "x", "ключ": 1}'.encode(), "application/json", "t\\u00ebxt"),
    "json-emoji-key": ("minilm", '{"😀": "x"}'.encode(), "application/json", "\\ud83d\\ude00"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_bad_input_gets_400_naming_the_problem(optimized_server, case):
    model, body, content_type, message = REFUSED[case]
    body = {"image-truncated-jpeg": photo_jpeg()[:20_000], "image-bomb": bomb_png()}.get(case, body)
    pids = worker_pids(optimized_server, model)
    started = time.monotonic()
    response = post(optimized_server, model, body, content_type)
    assert response.status_code == 400, response.text
    assert time.monotonic() - started < 10, "a bad request waited for a worker"
    assert response.headers["Content-Type"].startswith("application/json")
    assert message in response.text
    assert_still_served_by(optimized_server, model, pids)


def test_bomb_is_refused_before_it_is_decoded(optimized_server):
    peak = {w.process.pid: w.process.peak_rss_mb for w in optimized_server.api.workers() if w.model == "resnet50"}
    for _ in range(len(peak)):  # one per worker, whichever gets it
        assert post(optimized_server, "resnet50", bomb_png(), "image/png").status_code == 400
    after = {w.process.pid: w.process.peak_rss_mb for w in optimized_server.api.workers() if w.model == "resnet50"}
    assert after.keys() == peak.keys()
    for pid, before in peak.items():
        assert after[pid] - before < BOMB_PEAK_GROWTH_MB, f"worker {pid} peak RSS {before:.0f} -> {after[pid]:.0f} MB"


def test_body_over_the_limit_is_refused_by_the_frontend(optimized_server):
    pids = worker_pids(optimized_server, "resnet50")
    too_big = b"\xff" * (optimized_server.config.max_request_mb * 1024 * 1024 + 1)
    response = post(optimized_server, "resnet50", too_big, "image/jpeg")
    # Netty answers before any worker sees a byte; the status line is all it says.
    assert response.status_code == 413 and response.reason == "Request Entity Too Large"
    assert_still_served_by(optimized_server, "resnet50", pids)


@pytest.mark.parametrize(
    ("mode", "size", "fmt"),
    [("RGBA", (640, 480), "PNG"), ("L", (640, 480), "JPEG"), ("CMYK", (640, 480), "JPEG"), ("RGB", (1, 1), "PNG")],
    ids=["png-alpha", "grayscale-jpeg", "cmyk-jpeg", "one-pixel"],
)
def test_unusual_images_are_converted_and_served(optimized_server, mode, size, fmt):
    response = post(optimized_server, "resnet50", encode_image(mode, size, fmt), f"image/{fmt.lower()}")
    assert response.status_code == 200, response.text
    assert len(response.json()) == 5


def test_very_long_text_is_truncated_served_and_logged(optimized_server):
    text = ("All work and no play makes a long request. " * 2500)[:100_000]
    response = post(optimized_server, "bert", text.encode(), "text/plain")
    assert response.status_code == 200, response.text
    assert sum(response.json().values()) == pytest.approx(1.0, abs=1e-4)
    deadline = time.monotonic() + 20  # the frontend writes the worker's log asynchronously
    while "bert: input truncated to 128 tokens" not in optimized_server.logs.model_log.read_text(errors="replace"):
        assert time.monotonic() < deadline, "no truncation note in the model log"
        time.sleep(0.5)


def test_mixed_scripts_and_emoji_are_served(optimized_server):
    text = "Crème brûlée 🍮 ist lecker — очень вкусно, とても美味しい, 非常好吃 😋"
    response = post(optimized_server, "minilm", text.encode(), "text/plain; charset=utf-8")
    assert response.status_code == 200, response.text
    assert torch.linalg.norm(torch.tensor(response.json())).item() == pytest.approx(1.0, abs=1e-4)


BATCH_DELAY_S = 5


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory):
    # One worker (one CPU) that waits up to BATCH_DELAY_S to fill a batch of 4.
    config = ServeConfig.from_preset(
        "optimized", models=["minilm"], cpus=one_cpu(), batch_size=4, max_batch_delay_ms=BATCH_DELAY_S * 1000
    )
    server = start_server(tmp_path_factory.mktemp("batching"), config)
    yield server
    server.stop()


def test_bad_request_in_a_batch_fails_alone(batching_server):
    bodies = [b"first sentence", b"\xff\xfe not utf-8", b"second sentence", b"third sentence"]
    alone = []
    for body in bodies[::2]:
        alone.append(post(batching_server, "minilm", body, "text/plain").json())
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda body: post(batching_server, "minilm", body, "text/plain"), bodies))
    # The frontend holds a partial batch for the whole delay; back sooner means one full batch.
    assert time.monotonic() - start < BATCH_DELAY_S, "the four requests were not batched together"
    assert [r.status_code for r in responses] == [200, 400, 200, 200], [r.text for r in responses]
    assert "not valid UTF-8" in responses[1].text
    # Batched rows equal the same sentences served alone (padding rows do not leak in).
    torch.testing.assert_close(torch.tensor(responses[0].json()), torch.tensor(alone[0]), rtol=0, atol=EMBEDDING_ATOL)
    torch.testing.assert_close(torch.tensor(responses[2].json()), torch.tensor(alone[1]), rtol=0, atol=EMBEDDING_ATOL)


def test_model_registration_from_a_url_is_refused(optimized_server):
    url = "https://example.com/evil.mar"
    response = requests.post(
        optimized_server.api.url("management", "/models"),
        params={"url": url},
        headers=optimized_server.api.headers("management"),
        timeout=30,
    )
    assert response.status_code in (400, 403, 405), response.text
    models = requests.get(
        optimized_server.api.url("management", "/models"),
        headers=optimized_server.api.headers("management"),
        timeout=30,
    ).json()
    assert sorted(m["modelName"] for m in models["models"]) == ["bert", "minilm", "resnet50"]
