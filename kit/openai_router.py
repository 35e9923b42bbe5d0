"""One OpenAI base URL for every model the kit serves: the body's `model` picks the model.

    .venv/bin/python -m kit.openai_router --port 8000 --upstream http://127.0.0.1:8080 \\
        --models lm=text-generation,minilm=feature-extraction

    POST /v1/chat/completions, /v1/completions   a language model's (handlers/generation/api.py)
    POST /v1/embeddings                          a feature-extraction model's (handlers/embeddings_api.py)
    GET  /v1/models                              every model above, a language model's context as max_model_len
    GET  /metrics                                every model's serving numbers (kit/metrics_text.py), then
                                                 TorchServe's own: one scrape reads both

Every OpenAI-compatible server (vLLM, llama.cpp, OpenVINO Model Server, Ollama) serves one base
URL, and clients, SDKs and agent frameworks assume it; TorchServe serves each model at its own
path (/predictions/<model>/1.0/v1/...), and a frontend plugin cannot stream (its answer is one
whole HTTP response). So `make serve` starts this router beside TorchServe (kit/server.py): it
reads the body, forwards it to the model's path and passes the answer on as it comes, piece by
piece; a client that goes away closes the forwarded request, which ends its sequence in the
worker. The caller's `Authorization` goes on with it: with token auth on, TorchServe checks the
key an OpenAI client sends as its api_key. Errors, the router's and TorchServe's own (a wrong
key, a model not ready), are in OpenAI's shape. It starts for every server, language models or
not: its /metrics is where the kit's numbers are scraped (the container publishes it as the
metrics port's /metrics, kit/proxy.py).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from handlers.openai_shapes import error_body
from handlers.switches import STAGES_DIR
from kit import metrics_text
from kit.models import Task
from kit.paths import ROOT

if TYPE_CHECKING:
    from kit.serve_config import ServeConfig

# What each task answers at the base URL: the path after /v1/.
ROUTES: dict[Task, tuple[str, ...]] = {
    Task.TEXT_GENERATION: ("chat/completions", "completions"),
    Task.FEATURE_EXTRACTION: ("embeddings",),
}
FORWARDED = ("Authorization", "Content-Type", "Accept")
UPSTREAM_TIMEOUT_S = 130  # TorchServe answers or times out a request at 120 s


@dataclasses.dataclass(frozen=True)
class Routes:
    """The served models, by name, with their tasks."""

    models: dict[str, Task]

    @classmethod
    def parse(cls, text: str) -> Routes:
        """ "lm=text-generation,minilm=feature-extraction" -> Routes."""
        pairs = [item.split("=", 1) for item in text.split(",") if item]
        return cls({name: Task(task) for name, task in pairs})

    def serving(self) -> list[str]:
        return [name for name, task in self.models.items() if task in ROUTES]

    def resolve(self, path: str, body: Any) -> tuple[str | None, int, str]:
        """(the model to forward to, else None with the status and message that say why)."""
        model = body.get("model") if isinstance(body, dict) else None
        served = ", ".join(self.serving())
        if not isinstance(model, str):
            return None, 400, f'the body needs "model": one of {served}'
        task = self.models.get(model)
        if task not in ROUTES:
            return None, 404, f"model {model!r} is not served here; served: {served}"
        if path not in ROUTES[task]:
            paths = ", ".join(f"/v1/{p}" for p in ROUTES[task])
            return None, 404, f"model {model!r} ({task.value}) does not answer /v1/{path}; it answers {paths}"
        return model, 200, ""


def openai_error(message: str, status: int):
    from aiohttp import web

    return web.json_response(error_body(message, status), status=status)


# TorchServe 0.12's token authorization refuses a wrong or missing key with a 400 and this text;
# OpenAI's clients (and the issue of a key) expect a 401.
TOKEN_REFUSED = "Token Authorization failed"


def upstream_error(status: int, body: bytes) -> tuple[int, dict[str, Any]]:
    """TorchServe's own error (a wrong key, a model not ready) in OpenAI's shape, with its status;
    a handler's is in that shape already."""
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
        return status, decoded
    message = decoded.get("message") if isinstance(decoded, dict) else None
    message = str(message or body.decode(errors="replace").strip() or f"status {status}")
    if TOKEN_REFUSED in message:
        status = 401
    return status, error_body(message, status)


class Router:
    def __init__(
        self,
        upstream: str,
        routes: Routes,
        max_body_mb: int = 16,
        stages_dir: Path | None = None,
        torchserve_metrics: str | None = None,
    ):
        self.upstream, self.routes = upstream.rstrip("/"), routes
        self.stages_dir = stages_dir  # where the workers write their numbers; None: none of the kit's
        self.torchserve_metrics = torchserve_metrics  # TorchServe's /metrics URL; None: not added
        self.max_body = max_body_mb * 1024 * 1024  # TorchServe's max_request_size (config.max_request_mb)
        self.session = None  # aiohttp.ClientSession, made on the server's loop

    def app(self):
        from aiohttp import web

        # A bigger body is a 413 here, as TorchServe would answer it.
        app = web.Application(client_max_size=self.max_body)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/{path:.+}", self.forward)
        app.on_startup.append(self.open)
        app.on_cleanup.append(self.close)
        return app

    async def health(self, request):
        from aiohttp import web

        return web.json_response({"status": "ok"})

    async def metrics(self, request):
        from aiohttp import web

        text = "" if self.stages_dir is None else metrics_text.render(self.stages_dir)
        if self.torchserve_metrics:
            text += await self.fetch_torchserve_metrics()
        return web.Response(text=text, headers={"Content-Type": metrics_text.CONTENT_TYPE})

    async def fetch_torchserve_metrics(self) -> str:
        """TorchServe's own series; a comment when it does not answer (starting, stopping): the
        kit's series are still scraped."""
        import aiohttp

        try:
            async with self.session.get(self.torchserve_metrics, timeout=aiohttp.ClientTimeout(total=5)) as answer:
                if answer.status == 200:
                    return await answer.text()
                return f"# TorchServe's metrics answered {answer.status}\n"
        except (TimeoutError, aiohttp.ClientError) as error:
            return f"# TorchServe's metrics did not answer: {type(error).__name__}\n"

    async def open(self, app) -> None:
        import aiohttp

        # No limit on connections: every stream is a request of its own held open to TorchServe.
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=UPSTREAM_TIMEOUT_S),
            auto_decompress=False,
        )

    async def close(self, app) -> None:
        await self.session.close()

    def headers(self, request) -> dict[str, str]:
        return {name: request.headers[name] for name in FORWARDED if name in request.headers}

    async def forward(self, request):
        from aiohttp import web

        path = request.match_info["path"].strip("/")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return openai_error(
                f"the body is over {self.max_body // 2**20} MB (the serve config's max_request_mb)", 413
            )
        try:
            body = json.loads(raw)
        except ValueError as error:
            return openai_error(f"the body must be JSON: {error}", 400)
        model, status, message = self.routes.resolve(path, body)
        if model is None:
            return openai_error(message, status)
        url = f"{self.upstream}/predictions/{model}/1.0/v1/{path}"
        async with self.session.post(url, data=raw, headers=self.headers(request)) as upstream:
            if upstream.status >= 400:
                status, body = upstream_error(upstream.status, await upstream.read())
                return web.json_response(body, status=status)
            answer = web.StreamResponse(status=upstream.status)
            answer.content_type = upstream.content_type
            if upstream.charset:
                answer.charset = upstream.charset
            await answer.prepare(request)
            # Each piece as it comes: a streamed answer's events, or a whole one's body.
            async for piece in upstream.content.iter_any():
                await answer.write(piece)
            await answer.write_eof()
            return answer

    async def models(self, request):
        from aiohttp import web

        entries = await asyncio.gather(*(self.entry(name, request) for name in self.routes.serving()))
        return web.json_response({"object": "list", "data": list(entries)})

    async def entry(self, name: str, request) -> dict[str, Any]:
        """A model's entry: a language model's own (its context), else the name alone."""
        if self.routes.models[name] is Task.TEXT_GENERATION:
            url = f"{self.upstream}/predictions/{name}/1.0/v1/models"
            try:
                async with self.session.get(url, headers=self.headers(request)) as upstream:
                    if upstream.status == 200:
                        return (await upstream.json())["data"][0]
            except Exception:  # noqa: BLE001 - a model not ready is still listed, without its context
                pass
        return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "kit"}


# -- started beside TorchServe (kit/server.py) ------------------------------------------------
LOG_FILE = "openai_router.out"


def routes_of(models: Iterable[str]) -> Routes:
    """The models' tasks, from their model files; an archive the store holds without one (built by
    hand, as some tests do) has no task the kit knows, and is not routed."""
    from kit.models import Model, model_file

    return Routes({name: Model.load(name).task for name in models if model_file(name).is_file()})


def start(config: ServeConfig, run_dir: Path, upstream: str, torchserve_metrics: str) -> subprocess.Popen | None:
    """The router for `config`'s models, in a session of its own (as TorchServe is); None when the
    config has no OpenAI port."""
    if not config.openai_port:
        return None
    routes = routes_of(config.models)
    listed = ",".join(f"{name}={task.value}" for name, task in routes.models.items())
    command = [sys.executable, "-m", "kit.openai_router", "--host", config.bind, "--port", str(config.openai_port)]
    command += ["--max-body-mb", str(config.max_request_mb), "--upstream", upstream, "--models", listed]
    command += ["--stages-dir", str(run_dir / STAGES_DIR), "--torchserve-metrics", torchserve_metrics]
    with open(run_dir / LOG_FILE, "ab") as output:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def main(argv: list[str] | None = None) -> None:
    from aiohttp import web

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="TorchServe's inference URL")
    parser.add_argument("--models", required=True, help="name=task,... (kit.models Task values)")
    parser.add_argument("--max-body-mb", type=int, default=16, help="the largest body taken (max_request_mb)")
    parser.add_argument("--stages-dir", type=Path, default=None, help="the workers' numbers, for /metrics")
    parser.add_argument("--torchserve-metrics", default=None, help="TorchServe's /metrics URL, added to ours")
    args = parser.parse_args(argv)
    router = Router(
        args.upstream, Routes.parse(args.models), args.max_body_mb, args.stages_dir, args.torchserve_metrics
    )
    served = ", ".join(router.routes.serving()) or "no model (none answers the OpenAI API)"
    print(f"[openai] http://{args.host}:{args.port}/v1 -> {args.upstream} for {served}; /metrics")
    web.run_app(router.app(), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
