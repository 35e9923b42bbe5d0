"""Turn one TorchServe request into bytes, text or JSON, and the error type for bad input.

TorchServe hands each request as {"data"|"body": value}; value is already decoded when the
content type is application/json (a dict/list) or text/* (a str, or bytes if not UTF-8).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

HTTP_BAD_REQUEST = 400
JSON = "application/json"  # every answer of the kit's handlers, results and errors alike
# TorchServe 0.12's worker frames the status phrase by its length in characters but writes it as
# UTF-8 (ts/protocol/otf_message_handler.py): one non-ASCII character misaligns the frame, and the
# frontend restarts the worker or waits for it until the response timeout. Phrases are therefore
# ASCII and short; the full message goes in the JSON body, which TorchServe frames by bytes.
PHRASE_LIMIT = 160


# A response header TorchServe's frontend reads on gRPC answers: "false" ends a StreamPredictions
# stream. Without it the frontend dereferences null and drops the worker (GRPCJob.response).
STREAM_NEXT = "ts_stream_next"
URL_PATH = "url_path"  # the path after /predictions/<model>/<version>/, as TorchServe passes it


def over_grpc(headers: Mapping[str, Any]) -> bool:
    """Whether a request came over gRPC, from the headers TorchServe 0.12 hands the handler.

    They hold an entry per input field ({"data": {"content-type": ...}}) and, for REST only, the
    HTTP headers as strings: a REST request with a body always has Content-Length or
    Transfer-Encoding; gRPC requests carry none (grpcimpl/InferenceImpl passes the input map only).
    """
    return not any(isinstance(value, str) for value in headers.values())


class InvalidInput(ValueError):
    """The request body cannot be served; the message names the problem for the client."""

    code = HTTP_BAD_REQUEST
    reason = "bad_input"  # the refusal's label on the metrics port (handlers/stages.py)


class TooLong(InvalidInput):
    """The input is longer than the model takes, and the model refuses rather than truncates."""

    reason = "too_long"


class NotFound(InvalidInput):
    """The request's URL names no API the model serves."""

    code = 404
    reason = "not_found"


def request_body(request: Mapping[str, Any]) -> Any:
    body = request.get("data")
    if body is None:
        body = request.get("body")
    if isinstance(body, bytearray):
        body = bytes(body)
    if body is None or (isinstance(body, (bytes, str)) and len(body) == 0):
        raise InvalidInput("request body is empty")
    return body


def request_bytes(request: Mapping[str, Any]) -> bytes:
    body = request_body(request)
    if isinstance(body, str):
        return body.encode("utf-8")
    if not isinstance(body, bytes):
        raise InvalidInput(f"expected raw bytes in the body, got a JSON {type(body).__name__}")
    return body


def request_decoded(request: Mapping[str, Any]) -> Any:
    """The body as TorchServe hands it, with bytes read as UTF-8 and a JSON object sent without
    `Content-Type: application/json` (bytes, or text/*) parsed; other text stays text."""
    body = request_body(request)
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidInput(f"body is not valid UTF-8 (byte {error.start}: {error.reason})") from None
    if isinstance(body, str) and body.lstrip().startswith("{"):
        with contextlib.suppress(json.JSONDecodeError):  # plain text that starts with a brace
            body = json.loads(body)
    return body


def request_text(request: Mapping[str, Any], field: str = "text") -> str:
    """Plain UTF-8 body, or a JSON object {"text": "..."}."""
    body = request_decoded(request)
    if isinstance(body, dict):
        if not isinstance(body.get(field), str):
            raise InvalidInput(f'JSON body needs a string field "{field}", got keys {sorted(body)}')
        body = body[field]
    if not isinstance(body, str):
        raise InvalidInput(f'expected text or JSON {{"{field}": "..."}}, got a JSON {type(body).__name__}')
    if not body.strip():
        raise InvalidInput("text is empty or whitespace only")
    return body


def request_json(request: Mapping[str, Any]) -> Any:
    """A JSON body: already parsed (application/json), or bytes/text sent without that type."""
    body = request_body(request)
    if isinstance(body, (bytes, str)):
        try:
            return json.loads(body)
        except UnicodeDecodeError:
            raise InvalidInput("body is not JSON: it is not even UTF-8 (an image?)") from None
        except json.JSONDecodeError as error:
            raise InvalidInput(f"body is not JSON ({error.msg} at character {error.pos})") from None
    return body


def status_phrase(message: str) -> str:
    """`message` as a safe HTTP reason phrase: printable ASCII (others as escapes), bounded."""
    escaped = message.encode("ascii", "backslashreplace").decode("ascii")
    printable = "".join(c if " " <= c <= "~" else " " for c in escaped)
    return printable if len(printable) <= PHRASE_LIMIT else printable[: PHRASE_LIMIT - 3] + "..."


# The kit's one error shape, TorchServe's own (its frontend answers its errors so), typed by status:
# every handler, the worker and the auth proxy answer with it (OpenAI's paths with OpenAI's,
# handlers/openai_shapes.py).
ERROR_TYPES = {400: "InvalidInput", 401: "Unauthorized", 404: "NotFound", 503: "ServiceUnavailable"}


def error_body(message: str, code: int = HTTP_BAD_REQUEST) -> dict[str, Any]:
    return {"code": code, "type": ERROR_TYPES.get(code, "InternalServerException"), "message": message}
