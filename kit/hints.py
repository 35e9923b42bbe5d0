"""What `make serve` prints once every model is READY: the endpoints, and a call to try per model.

    print_endpoints(server)     # kit/__main__.py, after start_ready

The call is the one the model's task answers: a file or text for the classifiers and
embedders, a JSON sample for a tensor model, and OpenAI's chat API (curl, then the official
Python client) for a language model.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from kit.models import Model, Task
from kit.server import Server
from kit.server_api import KEY_FILE

# (the model's name, its URL: TorchServe's path, or for OpenAI's APIs the base URL, curl's auth option) -> lines
Hint = Callable[[str, str, str], list[str]]


def curl(body: str) -> Hint:
    # curl needs a Content-Type with --data: its default is a form, which TorchServe answers 500.
    return lambda name, url, auth: [f"curl{auth} {body} {url}"]


def chat(name: str, base: str, auth: str) -> list[str]:
    message = json.dumps({"model": name, "messages": [{"role": "user", "content": "Hello"}], "stream": True})
    # The Python line reads the key from $KEY (export it, as above), else sends none.
    return [
        f"curl -N{auth} -H 'Content-Type: application/json' --data '{message}' {base}/chat/completions",
        "python3 -c 'import os; from openai import OpenAI; "
        f'c = OpenAI(base_url="{base}", api_key=os.environ.get("KEY", "unused")); '
        f'print(c.chat.completions.create(model="{name}", messages=[{{"role": "user", "content": "Hello"}}])'
        ".choices[0].message.content)'",
    ]


# Tasks whose hint speaks OpenAI's API: given its base URL, not the model's path.
OPENAI_TASKS = frozenset({Task.TEXT_GENERATION})
HINTS: dict[Task, Hint] = {
    Task.IMAGE_CLASSIFICATION: curl("-T photo.jpg"),
    Task.TEXT_CLASSIFICATION: curl("-H 'Content-Type: text/plain' --data 'a great movie'"),
    Task.FEATURE_EXTRACTION: curl("-H 'Content-Type: text/plain' --data 'a sentence to embed'"),
    # One sample, shaped as the model file's input_shapes say (handlers/tensor.py).
    Task.TENSOR: curl("-H 'Content-Type: application/json' --data '{\"inputs\": [...]}'"),
    Task.TEXT_GENERATION: chat,
}


def print_endpoints(server: Server) -> None:
    c = server.config
    print(f"[serve] inference  {server.api.url('inference', '/predictions/<model>')}   models: {', '.join(c.models)}")
    print(f"[serve] management {server.api.url('management', '/models')}")
    if server.router_pid:
        print(f"[serve] metrics    {server.api.openai_url('/metrics')}   every model's numbers, then TorchServe's")
        print(f"[serve] openai     {server.api.openai_url('/v1')}   one base URL: the body's model picks the model")
    else:
        print(f"[serve] metrics    {server.api.url('metrics', '/metrics')}   TorchServe's")
    if c.token_auth_enabled:
        key_file = server.run_dir / KEY_FILE
        print(f"[serve] token auth is ON (bind {c.bind}); keys in {key_file}")
        print(f'  KEY=$(python3 -c \'import json; print(json.load(open("{key_file}"))["inference"]["key"])\')')
    auth = ' -H "Authorization: Bearer $KEY"' if c.token_auth_enabled else ""
    print("[serve] try:")
    for name in c.models:
        task = Model.load(name).task
        url = server.api.url("inference", f"/predictions/{name}")
        if task in OPENAI_TASKS:
            url = server.api.openai_url("/v1") if server.router_pid else f"{url}/1.0/v1"
        for line in HINTS[task](name, url, auth):
            print(f"  {line}")
