"""What OpenAI's API and clients share across endpoints: the error shape, the usage counts.

Its clients read `error.message` from any answer with a status >= 400.
"""

from __future__ import annotations

from typing import Any


def error_body(message: str, code: int) -> dict[str, Any]:
    kind = "server_error" if code >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
