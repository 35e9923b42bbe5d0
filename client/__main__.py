"""A small client for the kit's TorchServe: the REST inference API (requests) or gRPC.

.venv/bin/python -m client predict resnet50 cat.jpg       # an existing file: its bytes
.venv/bin/python -m client predict bert "some text"       # anything else: the text itself
.venv/bin/python -m client predict minilm "a sentence" --url http://10.0.0.5:8080 --token KEY
.venv/bin/python -m client --grpc 127.0.0.1:7070 predict bert "some text"   # gRPC Predictions
.venv/bin/python -m client generate lm "Once upon a time" --max-new-tokens 64   # streamed as it is written
.venv/bin/python -m client --grpc 127.0.0.1:7070 generate lm "Once upon a time"   # gRPC: whole
.venv/bin/python -m client ping
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import sys
from pathlib import Path

import requests

DEFAULT_URL = "http://127.0.0.1:8080"  # kit/ports.py INFERENCE_PORT; the client imports nothing of the kit


def payload(value: str) -> tuple[bytes, str]:
    """Body and Content-Type: a file's bytes if `value` names a file, else UTF-8 text."""
    path = Path(value)
    if path.is_file():
        content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return path.read_bytes(), content_type
    # text/plain, not curl's default form encoding, which the frontend would try to parse.
    return value.encode("utf-8"), "text/plain; charset=utf-8"


def predict(url: str, model: str, value: str, token: str = "", timeout: float = 60) -> requests.Response:
    body, content_type = payload(value)
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return requests.post(f"{url}/predictions/{model}", data=body, headers=headers, timeout=timeout)


def print_body(body: bytes) -> None:
    try:
        print(json.dumps(json.loads(body), indent=2))
    except ValueError:
        print(body.decode("utf-8", "replace"))


def generation(args: argparse.Namespace) -> dict:
    return {"prompt": args.prompt, "max_new_tokens": args.max_new_tokens, "stream": True}


def generate(url: str, args: argparse.Namespace) -> int:
    """A language model's answer printed as it streams (the kit's path: chunked text)."""
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    post = requests.post(
        f"{url}/predictions/{args.model}", json=generation(args), headers=headers, stream=True, timeout=60
    )
    with post as response:
        if not response.ok:
            print(response.text, file=sys.stderr)
            return 1
        for text in response.iter_content(chunk_size=None, decode_unicode=True):
            print(text, end="", flush=True)
    print()
    return 0


def grpc_main(args: argparse.Namespace) -> int:
    import grpc  # only this path needs it (and the stubs `make install` generates)

    from client import grpc_client

    try:
        if args.command == "ping":
            print(grpc_client.ping(args.grpc))
            return 0
        if args.command == "generate":  # whole: TorchServe 0.12 streams no gRPC answer (docs/generation.md)
            body = json.dumps({**generation(args), "stream": False}).encode()
            answer = json.loads(grpc_client.predict(args.grpc, args.model, body))
            if "text" not in answer:  # the kit's error body: {"code", "type", "message"}
                print_body(json.dumps(answer).encode())
                return 1
            print(answer["text"])
            return 0
        body, _ = payload(args.input)
        print_body(grpc_client.predict(args.grpc, args.model, body))
        return 0
    except grpc.RpcError as error:
        print(f"gRPC {error.code().name}: {error.details()}", file=sys.stderr)
        return 2 if error.code() is grpc.StatusCode.UNAVAILABLE else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m client", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default=DEFAULT_URL, help=f"inference API base URL (default {DEFAULT_URL})")
    parser.add_argument("--token", default="", help="inference key when token authorization is on")
    parser.add_argument("--grpc", default="", metavar="HOST:PORT", help="use the gRPC inference API there instead")
    commands = parser.add_subparsers(dest="command", required=True)
    predict_parser = commands.add_parser("predict", help="POST one input to /predictions/MODEL")
    predict_parser.add_argument("model")
    predict_parser.add_argument("input", help="a file path (sent as bytes) or text")
    generate_parser = commands.add_parser("generate", help="a language model's answer, printed as it streams")
    generate_parser.add_argument("model")
    generate_parser.add_argument("prompt")
    generate_parser.add_argument("--max-new-tokens", type=int, default=128)
    commands.add_parser("ping", help="GET /ping (healthy frontend; models may still be loading)")
    args = parser.parse_args(argv)
    if args.grpc:
        return grpc_main(args)
    try:
        if args.command == "generate":
            return generate(args.url, args)
        if args.command == "ping":
            response = requests.get(f"{args.url}/ping", timeout=10)
        else:
            response = predict(args.url, args.model, args.input, args.token)
    except requests.ConnectionError:
        print(f"cannot reach {args.url}; is the server up? (`make serve`)", file=sys.stderr)
        return 2
    try:
        print(json.dumps(response.json(), indent=2))
    except ValueError:
        print(response.text)
    return 0 if response.ok else 1


if __name__ == "__main__":
    sys.exit(main())
