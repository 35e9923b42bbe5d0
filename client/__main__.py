"""A small client for the kit's TorchServe: the REST inference API (requests) or gRPC.

.venv/bin/python -m client predict resnet50 cat.jpg       # an existing file: its bytes
.venv/bin/python -m client predict bert "some text"       # anything else: the text itself
.venv/bin/python -m client predict minilm "a sentence" --url http://10.0.0.5:8080 --token KEY
.venv/bin/python -m client --grpc 127.0.0.1:7070 predict bert "some text"   # gRPC Predictions
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


def grpc_main(args: argparse.Namespace) -> int:
    import grpc  # only this path needs it (and the stubs `make install` generates)

    from client import grpc_client

    try:
        if args.command == "ping":
            print(grpc_client.ping(args.grpc))
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
    commands.add_parser("ping", help="GET /ping (healthy frontend; models may still be loading)")
    args = parser.parse_args(argv)
    if args.grpc:
        return grpc_main(args)
    try:
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
