"""kit/openai_router.py: the body's model picks the model's path, answers pass on piece by piece,
errors (the router's and TorchServe's) in OpenAI's shape. TorchServe here is a scripted aiohttp app."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kit.models import Task
from kit.openai_router import Router, Routes

ROUTES = Routes({"lm": Task.TEXT_GENERATION, "minilm": Task.FEATURE_EXTRACTION, "resnet": Task.IMAGE_CLASSIFICATION})


def torchserve(seen: list) -> web.Application:
    """What the router forwards to: a model path that streams three events, one TorchServe refuses
    in its own shape (a wrong key), and an LM's model list."""

    async def stream(request):
        seen.append((request.path, await request.json(), request.headers.get("Authorization")))
        answer = web.StreamResponse()
        answer.content_type = "text/event-stream"
        await answer.prepare(request)
        for piece in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
            await answer.write(piece)
            await asyncio.sleep(0.01)
        return answer

    async def refused(request):  # TorchServe 0.12's token authorization: a 400, in text
        return web.Response(text="Token Authorization failed. Token either incorrect, expired", status=400)

    async def models(request):
        return web.json_response({"data": [{"id": "lm", "object": "model", "max_model_len": 2048}]})

    app = web.Application()
    app.router.add_post("/predictions/lm/1.0/v1/chat/completions", stream)
    app.router.add_post("/predictions/minilm/1.0/v1/embeddings", refused)
    app.router.add_get("/predictions/lm/1.0/v1/models", models)
    app.router.add_get(
        "/metrics", lambda request: web.Response(text='ts_queue_latency_microseconds{model_name="lm"} 5.0\n')
    )
    return app


async def exchange(calls, **router_options):
    """Start the fake TorchServe and the router in front of it; run `calls(client)`."""
    seen: list = []
    async with TestServer(torchserve(seen)) as upstream:
        options = {key: value(upstream) if callable(value) else value for key, value in router_options.items()}
        router = Router(str(upstream.make_url("")), ROUTES, max_body_mb=1, **options)
        async with TestClient(TestServer(router.app())) as client:
            return await calls(client), seen


def run(calls, **router_options):
    return asyncio.run(exchange(calls, **router_options))


def test_the_body_s_model_picks_its_path_and_the_stream_passes_on_with_the_key():
    async def calls(client):
        response = await client.post(
            "/v1/chat/completions", json={"model": "lm", "stream": True}, headers={"Authorization": "Bearer k"}
        )
        pieces = [piece async for piece in response.content.iter_any()]
        return response.status, response.content_type, b"".join(pieces)

    (status, content_type, body), seen = run(calls)
    assert (status, content_type) == (200, "text/event-stream")
    assert body == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    assert seen == [("/predictions/lm/1.0/v1/chat/completions", {"model": "lm", "stream": True}, "Bearer k")]


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("chat/completions", {"messages": []}, 400, 'the body needs "model": one of lm, minilm'),
        ("chat/completions", {"model": "gpt-4o"}, 404, "model 'gpt-4o' is not served here; served: lm, minilm"),
        ("chat/completions", {"model": "resnet"}, 404, "model 'resnet' is not served here"),
        ("embeddings", {"model": "lm"}, 404, "model 'lm' (text-generation) does not answer /v1/embeddings"),
        ("embeddings", {"model": "minilm"}, 401, "Token Authorization failed"),  # TorchServe's 400: a 401
    ],
)
def test_what_cannot_be_routed_or_is_refused_is_an_openai_error(path, body, status, message):
    async def calls(client):
        response = await client.post(f"/v1/{path}", json=body)
        return response.status, await response.json()

    (got, answer), seen = run(calls)
    assert got == status and message in answer["error"]["message"] and not seen


def test_a_body_over_the_limit_is_a_413_before_it_is_forwarded():
    async def calls(client):
        response = await client.post("/v1/embeddings", data=b'{"model": "minilm", "input": "' + b"x" * 2**20 + b'"}')
        return response.status, await response.json()

    (status, answer), seen = run(calls)
    assert status == 413 and "over 1 MB" in answer["error"]["message"] and not seen


def test_a_body_that_is_not_json_is_a_400():
    async def calls(client):
        response = await client.post("/v1/completions", data=b"{oops")
        return response.status, await response.json()

    (status, answer), _ = run(calls)
    assert status == 400 and answer["error"]["message"].startswith("the body must be JSON")


def test_models_lists_every_routed_model_a_language_models_with_its_context():
    async def calls(client):
        return await (await client.get("/v1/models")).json()

    listed, _ = run(calls)
    assert [(m["id"], m.get("max_model_len")) for m in listed["data"]] == [("lm", 2048), ("minilm", None)]


def test_routes_are_read_from_the_launch_argument():
    assert Routes.parse("lm=text-generation,minilm=feature-extraction").models == {
        "lm": Task.TEXT_GENERATION,
        "minilm": Task.FEATURE_EXTRACTION,
    }
    assert json.dumps(ROUTES.serving()) == '["lm", "minilm"]'


def test_only_models_with_a_model_file_are_routed():
    from kit.openai_router import routes_of

    assert routes_of(["minilm", "an-archive-built-by-hand"]).models == {"minilm": Task.FEATURE_EXTRACTION}


def test_metrics_are_the_workers_series_then_torchserves_and_only_ours_when_it_is_down(tmp_path):
    from handlers.stages import StageClock

    clock = StageClock("bert", tmp_path)
    clock.answered("ok", 3)
    clock.writer.write()

    async def calls(client):
        answer = await client.get("/metrics")
        return answer.headers["Content-Type"], await answer.text()

    (kind, text), _ = run(calls, stages_dir=tmp_path, torchserve_metrics=lambda up: str(up.make_url("/metrics")))
    assert kind.startswith("text/plain; version=0.0.4")
    ours = f'kit_requests_total{{model_name="bert",pid="{clock.pid}",outcome="ok"}} 3'
    assert text.index(ours) < text.index('ts_queue_latency_microseconds{model_name="lm"} 5.0')
    (_, text), _ = run(calls, stages_dir=tmp_path, torchserve_metrics="http://127.0.0.1:9/metrics")
    assert ours in text and "# TorchServe's metrics did not answer" in text
