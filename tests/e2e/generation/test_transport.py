"""The ways to a served language model: the container's authenticating proxy, gRPC, the kit's
client, bad requests answered by name with the worker serving on, a client that goes away
ending its sequence, and the frontend's threads while a stream flows."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time

import pytest
import requests

from client import grpc_client
from kit.paths import ROOT
from kit.ports import PORTS
from kit.proxy import AuthProxy
from kit.serve_config import ServeConfig
from kit.supervise import stop_proxy
from tests.e2e.conftest import one_cpu, start_server
from tests.e2e.generation.conftest import GPT2, QWEN
from tests.e2e.language_models import CHAT, PROMPTS, generate, url
from tests.jvm import counters

pytestmark = pytest.mark.e2e


def pinged(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def test_the_openai_client_streams_a_chat_through_the_containers_auth_proxy(sources, references, tmp_path):
    """The container's authenticating proxy (kit/proxy.py: nginx with a bearer key, as `python -m
    kit run --key-file` starts it) in front of a served language model: the official `openai`
    client with the key streams a chat through it piece by piece (the proxy does not hold them
    back), equal to transformers' answer; without the key it is refused."""
    from openai import AuthenticationError, OpenAI

    key_file = tmp_path / "api-key"
    key_file.write_text(secrets.token_urlsafe(32))
    key_file.chmod(0o600)
    config = ServeConfig.from_preset("optimized", variant="eager", models=[QWEN], cpus=one_cpu())
    server = start_server(tmp_path / "served", config)
    proxy = AuthProxy(key_file, *PORTS.take(2))
    nginx = proxy.start(server.config, tmp_path / "proxy")
    try:
        base = f"http://127.0.0.1:{proxy.inference_port}/v1"  # the one base URL, on the published port
        deadline = time.monotonic() + 30
        while not pinged(f"http://127.0.0.1:{proxy.inference_port}/ping"):
            assert time.monotonic() < deadline and nginx.poll() is None, "the proxy did not answer /ping"
            time.sleep(0.5)
        text, count = references[QWEN].chat(16)
        client = OpenAI(base_url=base, api_key=key_file.read_text())
        stream = client.chat.completions.create(
            model=QWEN, messages=CHAT, max_tokens=16, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
        assert chunks[-1].usage.completion_tokens == count
        # Piece by piece: the first piece of a long answer arrives long before its last.
        began, arrived = time.perf_counter(), []
        long = client.completions.create(
            model=QWEN, prompt=PROMPTS[0], max_tokens=400, stream=True, extra_body={"ignore_eos": True}
        )
        for chunk in long:
            if chunk.choices and chunk.choices[0].text:
                arrived.append(time.perf_counter() - began)
        assert len(arrived) > 100 and arrived[0] < 0.5 * arrived[-1], (len(arrived), arrived[0], arrived[-1])
        assert [m.id for m in client.models.list()] == [QWEN]
        with pytest.raises(AuthenticationError, match="send the API key as api_key"):
            OpenAI(base_url=base, api_key="not-the-key").chat.completions.create(model=QWEN, messages=CHAT)
    finally:
        stop_proxy(nginx)
        server.stop()


@pytest.mark.parametrize(
    ("model", "path", "body", "code", "message"),
    [
        (QWEN, "", {"prompt": "hi", "temperature": "hot"}, 400, "temperature must be a number"),
        (QWEN, "", {"prompt": "  "}, 400, "prompt is empty"),
        (QWEN, "", {"prompt": "word " * 3000}, 400, "this model's context is 2048 tokens"),
        (QWEN, "v1/completions", {"prompt": "hi", "n": 17}, 400, "n must be from 1 to 16, got 17"),
        (GPT2, "v1/chat/completions", {"messages": CHAT}, 400, "no chat template"),
        (QWEN, "v1/embeddings", {"input": "hi"}, 404, "unknown path 'v1/embeddings'"),
    ],
)
def test_a_bad_request_gets_its_error_and_the_worker_serves_on(server, model, path, body, code, message):
    response = generate(server, model, body, path)
    assert response.status_code == code
    error = response.json()
    assert message in (error["message"] if "message" in error else error["error"]["message"])
    assert generate(server, model, {"prompt": "still there?", "max_new_tokens": 2}).status_code == 200


def test_grpc_answers_whole_as_rest_does(server):
    target = f"127.0.0.1:{server.config.grpc_inference_port}"
    body = {"prompt": PROMPTS[0], "max_new_tokens": 12}
    answer = json.loads(grpc_client.predict(target, GPT2, json.dumps(body).encode()))
    assert answer == generate(server, GPT2, body).json()


@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_the_client_prints_the_answer_as_it_streams(server, transport):
    """`python -m client [--grpc HOST:PORT] generate MODEL PROMPT`: the text the whole answer has."""
    body = {"prompt": PROMPTS[1], "max_new_tokens": 10}
    whole = generate(server, QWEN, body).json()["text"]
    where = (
        ["--grpc", f"127.0.0.1:{server.config.grpc_inference_port}"]
        if transport == "grpc"
        else ["--url", url(server, QWEN).removesuffix(f"/predictions/{QWEN}")]
    )
    command = [sys.executable, "-m", "client", *where, "generate", QWEN, PROMPTS[1], "--max-new-tokens", "10"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == whole + "\n"


def test_a_client_that_goes_away_ends_its_sequence(server):
    """continuousBatching (Qwen's): the frontend leaves a request whose client closed its connection
    out of its next batch, and the worker ends its sequence at the next step (its slot serves the
    next request: tests/unit/handlers/generation/test_engine.py). When the frontend holds no other
    request it sends no batch: the worker learns it with the next request's, and generates nothing
    for the gone ones meanwhile."""
    cancelled = re.compile(rf"{QWEN}: request (\S+) cancelled after (\d+) token\(s\)")
    before = len(cancelled.findall(server.logs.model_log.read_text(errors="replace")))
    openai = {"model": QWEN, "prompt": PROMPTS[1], "max_tokens": 2000, "ignore_eos": True, "stream": True}
    bodies = [
        ({"prompt": PROMPTS[0], "max_new_tokens": 2000, "ignore_eos": True, "stream": True}, url(server, QWEN)),
        ({"prompt": PROMPTS[1], "max_new_tokens": 2000, "ignore_eos": True}, url(server, QWEN)),  # whole
        (openai, url(server, QWEN, "v1/completions")),
        (openai, server.api.openai_url("/v1/completions")),  # through the one base URL: the router lets go too
    ]
    for body, address in bodies:
        response = requests.post(address, json=body, timeout=120, stream=True)
        assert response.status_code == 200  # the answer is open before its first token
        if body.get("stream"):
            next(response.iter_content(None))
        response.close()
    time.sleep(2)  # a step or more: the last of them may hold the engine until a batch comes
    assert generate(server, QWEN, {"prompt": "still there?", "max_new_tokens": 2}).status_code == 200
    found = cancelled.findall(server.logs.model_log.read_text(errors="replace"))[before:]
    assert len(found) == len(bodies), f"cancelled: {found}; the worker did not learn that clients left"
    assert all(int(tokens) < 2000 for _, tokens in found)  # ended where its client left, not at its end


def test_the_frontend_starts_no_thread_for_each_streamed_token(server):
    """continuousBatching: every step is a message from the frontend to the worker, each sent from
    a task of the JVM's common pool; a pool sized at one (a frontend on 2 CPUs) would be a thread
    started per task, a thread a token (kit/properties.py, common_pool_threads)."""
    frontend = next(p for p in server.process_tree() if p.name() == "java")
    before = counters(frontend.pid)["java.threads.started"]
    body = {"model": QWEN, "prompt": PROMPTS[0], "max_tokens": 48, "ignore_eos": True, "stream": True}
    with requests.post(url(server, QWEN, "v1/completions"), json=body, timeout=120, stream=True) as response:
        assert response.status_code == 200
        chunks = sum(1 for line in response.iter_lines() if line.startswith(b"data: {"))
    assert chunks >= 24  # a token an event, but for those whose text is held back (part of a character)
    started = counters(frontend.pid)["java.threads.started"] - before
    assert started <= 4, f"{started} frontend threads started for a stream of {chunks} chunks"
