"""A sequence's text -> pieces to the frontend, in its request's API's shapes (api.py, replies.py).

    responder = Responder(replies, request_id, answer, stream=True, grpc=False, choices=2)
    engine.submit_all([(g, responder.choice(i)) for i, g in enumerate(generations)])  # each choice's text(), finish()
    responder.open()                              # the HTTP answer's status and headers, at once

HTTP: the answer is opened as soon as the request is queued (ts_stream_next true, status 200, its
content type), so that under continuousBatching the frontend checks the client is still there
with every piece it passes on, from the start (replies.py, StepReplies); streamed, each delta is
a piece and the last one ends it (false); whole, the body comes in the piece that ends it. A
request of n choices is n sequences: streamed, their chunks interleave, each naming its choice,
and the stream ends when the last has; whole, the body waits for the last. A request with tools
reads each choice's text for calls (tools.py CallStream): content passes on as it is known not to
open a call, each call once it is complete. gRPC:
always one piece, whole: TorchServe's worker cannot tell Predictions from StreamPredictions, and
a second piece to a Predictions call that has completed ends the frontend's connection to the
worker (GRPCJob). The engine's thread and the worker's reader (open) both write: one lock, so
that the opening piece goes first.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

from handlers.generation.answers import JSON, Answer, Said, encode, error_body
from handlers.generation.fields import Api
from handlers.generation.logprobs import TokenLogprob
from handlers.generation.sequences import NO_USAGE, Finish, Usage
from handlers.generation.tools import CallStream, ToolCall
from handlers.replies import Transport


class Responder:
    def __init__(self, replies: Transport, request_id: str, answer: Answer, stream: bool, grpc: bool, choices: int = 1):
        self.replies, self.request_id, self.answer = replies, request_id, answer
        self.stream = stream and not grpc
        self.grpc = grpc
        self.opened = False  # the HTTP answer's first piece is out
        self.parts: list[list[str]] = [[] for _ in range(choices)]
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in range(choices)]
        self.reasons: dict[int, Finish] = {}  # by choice, as each ends
        tools = answer.request.tools
        self.readers = [CallStream(tools) for _ in range(choices)] if tools else []
        self.calls: list[list[ToolCall]] = [[] for _ in range(choices)]
        self.usage = NO_USAGE  # of the choices ended so far
        self.lock = threading.Lock()

    @property
    def content_type(self) -> str:
        return self.answer.stream_type if self.stream else JSON

    def choice(self, index: int) -> Choice:
        """The sink of choice `index`'s sequence."""
        return Choice(self, index)

    def open(self) -> None:
        with self.lock:
            self._open()

    def _open(self) -> None:
        if not self.opened and not self.grpc:
            self.opened = True
            first = self.answer.first() if self.stream else b""
            self.replies.send(self.request_id, first, self.content_type, more=True)

    def text(self, delta: str, logprobs: Sequence[TokenLogprob] = (), index: int = 0) -> None:
        if not self.stream:
            self.parts[index].append(delta)
            self.logprobs[index].extend(logprobs)
            return
        with self.lock:
            self._open()
            if self.readers:
                body = self._read(index, *self.readers[index].feed(delta), logprobs)
            else:
                body = self.answer.chunk(delta, index, logprobs)
            if body:
                self.replies.send(self.request_id, body, self.content_type, more=True)

    def _read(self, index: int, content: str, calls: Sequence[ToolCall], logprobs: Sequence[TokenLogprob]) -> bytes:
        """A streamed piece of what a choice's calls reader passed on: content, then calls."""
        body = self.answer.chunk(content, index, logprobs) if content else b""
        if calls:
            body += self.answer.calls(calls, index, len(self.calls[index]))
            self.calls[index].extend(calls)
        return body

    def finish(self, reason: Finish, usage: Usage, index: int = 0) -> None:
        with self.lock:
            self.reasons[index] = reason
            self.usage = usage = self.usage.plus(usage)
            last = len(self.reasons) == len(self.parts)
            if self.stream:
                body = self._read(index, *self.readers[index].close(), ()) if self.readers else b""
                body += self.answer.finished(reason, index, bool(self.calls[index]))
                body += self.answer.closing(usage) if last else b""
            elif last:
                body = encode(self.answer.whole([self._said(i) for i in range(len(self.parts))], usage))
            else:
                return
            self._open()
            self.replies.send(self.request_id, body, self.content_type, more=not last)

    def _said(self, index: int) -> Said:
        text = "".join(self.parts[index])
        if not self.readers:
            return Said(text, self.reasons[index], self.logprobs[index])
        reader = self.readers[index]
        content, calls = reader.feed(text)
        rest, more = reader.close()
        return Said(content + rest, self.reasons[index], self.logprobs[index], (*calls, *more))


@dataclasses.dataclass(frozen=True)
class Choice:
    """One choice's sequence's sink: its text and its end, to the request's Responder."""

    responder: Responder
    index: int

    def text(self, delta: str, logprobs: Sequence[TokenLogprob] = ()) -> None:
        self.responder.text(delta, logprobs, self.index)

    def finish(self, reason: Finish, usage: Usage) -> None:
        self.responder.finish(reason, usage, self.index)


def answer_whole(replies: Transport, request_id: str, payload: dict, grpc: bool) -> None:
    """An answer that needs no engine (the model list), as a whole answer goes: opened, then its body."""
    if not grpc:
        replies.send(request_id, b"", JSON, more=True)
    replies.send(request_id, encode(payload), JSON, more=False)


def refuse(replies: Transport, request_id: str, api: Api, message: str, code: int, grpc: bool) -> None:
    """A request that is not generated: its error, in its API's shape, and the request released."""
    replies.refuse(request_id, encode(error_body(api, message, code)), JSON, code, message, grpc)
