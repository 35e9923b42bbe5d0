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

Hint = Callable[[str, str, str], list[str]]  # (the model's name, its URL, curl's auth option) -> lines


def curl(body: str) -> Hint:
    # curl needs a Content-Type with --data: its default is a form, which TorchServe answers 500.
    return lambda name, url, auth: [f"curl{auth} {body} {url}"]


def chat(name: str, url: str, auth: str) -> list[str]:
    message = json.dumps({"model": name, "messages": [{"role": "user", "content": "Hello"}], "stream": True})
    # The Python line reads the key from $KEY (export it, as above), else sends none.
    return [
        f"curl -N{auth} -H 'Content-Type: application/json' --data '{message}' {url}/1.0/v1/chat/completions",
        "python3 -c 'import os; from openai import OpenAI; "
        f'c = OpenAI(base_url="{url}/1.0/v1", api_key=os.environ.get("KEY", "unused")); '
        f'print(c.chat.completions.create(model="{name}", messages=[{{"role": "user", "content": "Hello"}}])'
        ".choices[0].message.content)'",
    ]


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
    print(f"[serve] metrics    {server.api.url('metrics', '/metrics')}")
    if c.token_auth_enabled:
        key_file = server.run_dir / KEY_FILE
        print(f"[serve] token auth is ON (bind {c.bind}); keys in {key_file}")
        print(f'  KEY=$(python3 -c \'import json; print(json.load(open("{key_file}"))["inference"]["key"])\')')
    auth = ' -H "Authorization: Bearer $KEY"' if c.token_auth_enabled else ""
    print("[serve] try:")
    for name in c.models:
        for line in HINTS[Model.load(name).task](name, server.api.url("inference", f"/predictions/{name}"), auth):
            print(f"  {line}")
