"""Dynamic batching through real TorchServe: mixed concurrent load, outputs equal to eager,
and nothing compiled while serving (torch.compile buckets; AOTInductor int8 packages)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from handlers.calibration import SENTENCES, synthetic_photo
from handlers.image import image_to_tensor
from handlers.loaders import load_model
from handlers.settings import Architecture, ImageSettings, TextSettings
from handlers.text import encode, load_tokenizer
from kit.serve_config import ServeConfig
from kit.server import Server
from kit.variant import Variant
from tests.e2e.conftest import one_cpu, start_server
from tests.e2e.test_serving import assert_workers_run_where_the_plan_put_them, post

pytestmark = pytest.mark.e2e

BATCHING = {"batch_size": 4, "max_batch_delay_ms": 20}
# Mixed load: 8 clients, requests of different lengths and images of different sizes.
CLIENTS = 8


def served_buckets(server: Server, model: str) -> set[int]:
    text = server.logs.model_log.read_text(errors="replace")
    return {int(b) for b in re.findall(rf"{model}: first batch at bucket (\d+)", text)}


def assert_no_recompile(server: Server) -> None:
    log = server.logs.model_log.read_text(errors="replace")
    assert "recompiled while serving" not in log, "a request waited for the compiler"


@pytest.fixture(scope="module")
def inductor_batching(tmp_path_factory):
    # One worker: each worker compiles the model's graphs at its start (frozen graphs are not cached).
    config = ServeConfig.from_preset("optimized", models=["minilm"], cpus=one_cpu(), **BATCHING)
    server = start_server(tmp_path_factory.mktemp("batching-inductor"), config)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def int8_batching(tmp_path_factory):
    # Every CPU this process may use: the plan's workers of each model on CPUs of their own.
    config = ServeConfig.from_preset("optimized", variant="aoti-int8", models=["resnet50", "minilm"], **BATCHING)
    server = start_server(tmp_path_factory.mktemp("batching-int8"), config)
    yield server
    server.stop()


def embed_all(server: Server, texts: list[str]) -> list[torch.Tensor]:
    def one(text: str) -> torch.Tensor:
        response = post(server, "minilm", text.encode(), "text/plain")
        assert response.status_code == 200, response.text
        return torch.tensor(response.json())

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(one, texts))


def eager_embeddings(model_dir, texts: list[str]) -> torch.Tensor:
    model = load_model(TextSettings(architecture=Architecture.SENTENCE_EMBEDDER), model_dir)
    tokenizer = load_tokenizer(model_dir)
    with torch.inference_mode():
        return torch.cat([model(*(t[None] for t in encode(tokenizer, text, 128).inputs)) for text in texts])


def test_inductor_batches_mixed_load_without_recompiling(inductor_batching):
    texts = [SENTENCES[i % len(SENTENCES)] * (1 + i % 3) for i in range(48)]
    served = torch.stack(embed_all(inductor_batching, texts))
    expected = eager_embeddings(Variant.load("eager").archive("minilm"), texts)
    torch.testing.assert_close(served, expected, rtol=0, atol=1e-4)  # float32: summation order only
    assert served_buckets(inductor_batching, "minilm") - {1}, "no batch of more than one request was formed"
    assert_no_recompile(inductor_batching)


def test_int8_packages_serve_batches_close_to_eager(int8_batching):
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(32)]
    served = torch.stack(embed_all(int8_batching, texts))
    expected = eager_embeddings(Variant.load("eager").archive("minilm"), texts)
    cosine = torch.nn.functional.cosine_similarity(served, expected, dim=1)
    assert cosine.min() >= 0.98, f"int8 embeddings drifted: cosine {cosine.min():.4f}"

    photos = [synthetic_photo(100 + i) for i in range(16)]
    with ThreadPoolExecutor(CLIENTS) as pool:
        responses = list(pool.map(lambda body: post(int8_batching, "resnet50", body, "image/jpeg"), photos))
    model = load_model(ImageSettings(), Variant.load("eager").archive("resnet50"))
    agree = 0
    for response, photo in zip(responses, photos, strict=True):
        assert response.status_code == 200, response.text
        with torch.inference_mode():
            expected_top = int(model(image_to_tensor(photo)[None])[0].argmax())
        agree += int(next(iter(response.json())) == str(expected_top))
    assert agree / len(photos) >= 0.9, f"top-1 agreement with float32 eager {agree}/{len(photos)}"
    assert served_buckets(int8_batching, "minilm") - {1} and served_buckets(int8_batching, "resnet50") - {1}
    assert_no_recompile(int8_batching)
    assert "backend=aoti" in int8_batching.logs.model_log.read_text()


def test_openais_client_embeds_more_texts_than_a_batch_through_the_kit(inductor_batching):
    from openai import BadRequestError, OpenAI

    key = inductor_batching.api.keys().get("inference") or "unused"
    client = OpenAI(base_url=inductor_batching.api.url("inference", "/predictions/minilm/1.0/v1"), api_key=key)
    texts = [SENTENCES[i % len(SENTENCES)] * (1 + i % 2) for i in range(9)]  # 9 rows: forwards of 4, 4 and 1
    expected = eager_embeddings(Variant.load("eager").archive("minilm"), texts)
    packed = client.embeddings.create(model="minilm", input=texts)  # the client asks for base64 and decodes it
    served = torch.tensor([item.embedding for item in packed.data])
    torch.testing.assert_close(served, expected, rtol=0, atol=1e-4)
    tokenizer = load_tokenizer(Variant.load("eager").archive("minilm"))
    assert packed.usage.prompt_tokens == sum(int(encode(tokenizer, text, 128).inputs[1].sum()) for text in texts)
    single = client.embeddings.create(model="minilm", input=texts[1], encoding_format="float")
    torch.testing.assert_close(torch.tensor(single.data[0].embedding), expected[1], rtol=0, atol=1e-4)
    with pytest.raises(BadRequestError, match="as token ids is not served"):
        client.embeddings.create(model="minilm", input=[[101, 102]])
    assert_no_recompile(inductor_batching)


def test_workers_of_a_plan_over_every_cpu_run_where_it_put_them(int8_batching):
    assert_workers_run_where_the_plan_put_them(int8_batching)
