"""A sequence's text -> pieces to the frontend, in its request's API's shapes (api.py, replies.py).

    responder = Responder(replies, request_id, answer, stream=True, grpc=False)
    engine.submit(generation, responder)          # the engine calls text() and finish()
    responder.open()                              # the HTTP answer's status and headers, at once

HTTP: the answer is opened as soon as the request is queued (ts_stream_next true, status 200, its
content type), so that under continuousBatching the frontend checks the client is still there
with every piece it passes on, from the start (replies.py, StepReplies); streamed, each delta is
a piece and the last one ends it (false); whole, the body comes in the piece that ends it. gRPC:
always one piece, whole: TorchServe's worker cannot tell Predictions from StreamPredictions, and
a second piece to a Predictions call that has completed ends the frontend's connection to the
worker (GRPCJob). The engine's thread and the worker's reader (open) both write: one lock, so
that the opening piece goes first.
"""

from __future__ import annotations

import threading

from handlers.generation.api import JSON, Answer, Api, Usage, encode, error_body
from handlers.generation.scheduler import Finish
from handlers.replies import Transport


class Responder:
    def __init__(self, replies: Transport, request_id: str, answer: Answer, stream: bool, grpc: bool):
        self.replies, self.request_id, self.answer = replies, request_id, answer
        self.stream = stream and not grpc
        self.grpc = grpc
        self.opened = False  # the HTTP answer's first piece is out
        self.parts: list[str] = []
        self.lock = threading.Lock()

    @property
    def content_type(self) -> str:
        return self.answer.stream_type if self.stream else JSON

    def open(self) -> None:
        with self.lock:
            self._open()

    def _open(self) -> None:
        if not self.opened and not self.grpc:
            self.opened = True
            first = self.answer.first() if self.stream else b""
            self.replies.send(self.request_id, first, self.content_type, more=True)

    def text(self, delta: str) -> None:
        if not self.stream:
            self.parts.append(delta)
            return
        with self.lock:
            self._open()
            self.replies.send(self.request_id, self.answer.chunk(delta), self.content_type, more=True)

    def finish(self, reason: Finish, prompt_tokens: int, completion_tokens: int) -> None:
        usage = Usage(prompt_tokens, completion_tokens)
        if self.stream:
            body = self.answer.end(reason, usage)
        else:
            body = encode(self.answer.whole("".join(self.parts), reason, usage))
        with self.lock:
            self._open()
            self.replies.send(self.request_id, body, self.content_type, more=False)


def refuse(replies: Transport, request_id: str, api: Api, message: str, code: int, grpc: bool) -> None:
    """A request that is not generated: its error, in its API's shape, and the request released."""
    replies.refuse(request_id, encode(error_body(api, message, code)), JSON, code, message, grpc)
