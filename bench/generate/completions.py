"""What the bench's generative peer apps (generate_peer.py, openvino_genai_peer.py) share: where
they listen, their health check, and OpenAI's completions shapes.

No kit module is imported: the OpenVINO GenAI peer runs in a virtual environment of its own.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator

HOST = "127.0.0.1"
HEALTH_PATH = "/health"  # answers once the model is loaded: bench/generate/run.py waits for it


def app():
    """A FastAPI app with the health check, for a peer to add its completions route to."""
    from fastapi import FastAPI

    served = FastAPI()
    served.get(HEALTH_PATH)(lambda: {"status": "ok"})
    return served


class Completion:
    """One request's answer: its id and time, and its pieces as OpenAI's clients parse them."""

    def __init__(self, model: str | None):
        self.name, self.created, self.model = f"cmpl-{uuid.uuid4()}", int(time.time()), model

    def chunk(self, text: str, reason: str | None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return {
            "id": self.name,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def whole(self, text: str, prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self.chunk(text, "length"), "usage": usage(prompt_tokens, completion_tokens)}

    def events(self, texts: Iterable[str], prompt_tokens: int, completion_tokens: Callable[[], int]) -> Iterator[str]:
        """Server-sent events: a chunk per text, the last chunk, the usage, [DONE]. The number of
        tokens is asked for once the texts are spent."""
        for text in texts:
            if text:
                yield f"data: {json.dumps(self.chunk(text, None))}\n\n"
        yield f"data: {json.dumps(self.chunk('', 'length'))}\n\n"
        last = {
            "id": self.name,
            "object": "text_completion",
            "created": self.created,
            "choices": [],
            "usage": usage(prompt_tokens, completion_tokens()),
        }
        yield f"data: {json.dumps(last)}\n\n"
        yield "data: [DONE]\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
