"""A sequence's text -> frames to the frontend, in its request's API's shapes (api.py, replies.py).

    responder = Responder(replies, request_id, answer, stream=True, grpc=False)
    engine.submit(generation, responder)          # the engine calls text() and finish()

HTTP, streamed: the first frame opens the chunked answer (ts_stream_next true), each delta is a
frame, the last one ends it (false). HTTP, whole: the body in one frame that opens a chunked
answer and an empty one that ends it, because the frontend forgets a request only on a "false"
frame and a "false" frame alone opens no HTTP answer (replies.py). gRPC: always one frame, whole:
TorchServe's worker cannot tell Predictions from StreamPredictions, and a second frame to a
Predictions call that has completed ends the frontend's connection to the worker (GRPCJob).
"""

from __future__ import annotations

from handlers.generation.api import JSON, Answer, Api, Usage, encode, error_body
from handlers.generation.engine import Finish
from handlers.replies import Replies


class Responder:
    def __init__(self, replies: Replies, request_id: str, answer: Answer, stream: bool, grpc: bool):
        self.replies, self.request_id, self.answer = replies, request_id, answer
        self.stream = stream and not grpc
        self.grpc = grpc
        self.opened = False  # a streamed answer's first frame is out
        self.parts: list[str] = []

    def text(self, delta: str) -> None:
        if not self.stream:
            self.parts.append(delta)
            return
        body = self.answer.chunk(delta)
        if not self.opened:
            body, self.opened = self.answer.first() + body, True
        self.replies.send(self.request_id, body, self.answer.stream_type, more=True)

    def finish(self, reason: Finish, prompt_tokens: int, completion_tokens: int) -> None:
        usage = Usage(prompt_tokens, completion_tokens)
        if self.stream:
            end = self.answer.end(reason, usage)
            if not self.opened:  # nothing was generated: the opening frame carries it all
                self.replies.send(self.request_id, self.answer.first() + end, self.answer.stream_type, more=True)
                end = b""
            self.replies.send(self.request_id, end, self.answer.stream_type, more=False)
            return
        body = encode(self.answer.whole("".join(self.parts), reason, usage))
        if self.grpc:
            self.replies.send(self.request_id, body, JSON, more=False)
        else:
            self.replies.send(self.request_id, body, JSON, more=True)
            self.replies.send(self.request_id, b"", JSON, more=False)


def refuse(replies: Replies, request_id: str, api: Api, message: str, code: int, grpc: bool) -> None:
    """A request that is not generated: its error, in its API's shape, and the request released."""
    replies.refuse(request_id, encode(error_body(api, message, code)), JSON, code, message, grpc)
