"""Answer frames a language model's handler writes to the frontend itself, over one of TorchServe
0.12's two generative protocols (the model file's `batching`, handlers/generation/settings.py).

    replies = Replies(socket)                                       # asyncCommunication
    replies.send(request_id, b"chunk", "text/plain", more=True)     # one piece of a stream
    replies.send(request_id, b"", "text/plain", more=False)         # the request is answered

    replies = StepReplies()                                         # continuousBatching
    replies.send(...)                                               # the same calls, held until
    socket.sendall(replies.answer())                                # the worker's next answer

A prediction holds one request's piece. Its `ts_stream_next` header decides what the frontend
does (wlm/AsyncBatchAggregator, wlm/ContinuousBatching, job/RestJob, job/GRPCJob):
- "true": an HTTP answer is opened (status and headers from this frame) or continued, chunked;
- "false": the request is done and forgotten. Without it asyncCommunication keeps the request
  forever (a leak) and an HTTP answer made of frames without the header is never closed;
- no header: a whole HTTP answer, of any status (a 4xx closes the connection after it); under
  continuousBatching the request is forgotten too, under asyncCommunication it is not.
A frame's top-level code stays 200: any other would fail every request the worker holds.
"""

from __future__ import annotations

import abc
import socket
import struct
import threading
import time
from collections.abc import Iterable

from handlers.payload import status_phrase

SUCCESS = b"Prediction success"
# How long the engine waits, before a step, for the batch that followed the previous step's answer
# (its new requests join this step). The frontend sends it a round trip after the answer, well
# within a step, while it holds a request of the worker. When it holds none, the engine's
# sequences are ones whose clients went away, and it sends nothing until a new request comes,
# with a batch that tells the worker so: the engine waits for it, generating nothing meanwhile,
# at most this long before it steps once more.
SETTLE_S = 60.0


def _field(data: bytes) -> bytes:
    return struct.pack("!i", len(data)) + data


def prediction(
    request_id: str, body: bytes, content_type: str, status: int = 200, phrase: str = "", more: bool | None = None
) -> bytes:
    """One request's piece of an answer message. more: True/False sets ts_stream_next; None leaves
    it out (a whole answer)."""
    headers = {} if more is None else {"ts_stream_next": "true" if more else "false"}
    piece = _field(request_id.encode()) + _field(content_type.encode())
    piece += struct.pack("!i", status) + _field(status_phrase(phrase).encode())
    piece += struct.pack("!i", len(headers))
    for key, value in headers.items():
        piece += _field(key.encode()) + _field(value.encode())
    return piece + _field(body)


def message(predictions: Iterable[bytes]) -> bytes:
    """TorchServe 0.12's predict response: its code and message, then the predictions."""
    return struct.pack("!i", 200) + _field(SUCCESS) + b"".join(predictions) + struct.pack("!i", -1)


def answer_frame(
    request_id: str, body: bytes, content_type: str, status: int = 200, phrase: str = "", more: bool | None = None
) -> bytes:
    """A message holding one prediction."""
    return message([prediction(request_id, body, content_type, status, phrase, more)])


class Transport(abc.ABC):
    """What a language model's handler answers through: the worker's, for one of the protocols."""

    def send(
        self,
        request_id: str,
        body: bytes,
        content_type: str,
        status: int = 200,
        phrase: str = "",
        more: bool | None = None,
    ) -> None:
        self.deliver(request_id, prediction(request_id, body, content_type, status, phrase, more), more, content_type)

    @abc.abstractmethod
    def deliver(self, request_id: str, piece: bytes, more: bool | None, content_type: str) -> None:
        """A piece on its way to the frontend."""

    @abc.abstractmethod
    def refuse(self, request_id: str, body: bytes, content_type: str, status: int, phrase: str, grpc: bool) -> None:
        """An error answer, whole, and the request released."""

    @abc.abstractmethod
    def new(self, request_id: str) -> bool:
        """Whether a request of a batch is new (for the handler to accept)."""

    @abc.abstractmethod
    def settle(self) -> None:
        """Called by the engine after each step."""

    @abc.abstractmethod
    def close(self) -> None:
        """The frontend has gone: nothing more to wait for."""


class Replies(Transport):
    """asyncCommunication: each piece is a message of its own, written at once. Several threads
    answer at once (the engine, the reader refusing a bad request): one lock."""

    def __init__(self, connection: socket.socket):
        self.connection = connection
        self.lock = threading.Lock()

    def deliver(self, request_id: str, piece: bytes, more: bool | None, content_type: str) -> None:
        frame = message([piece])
        with self.lock:
            self.connection.sendall(frame)

    def refuse(self, request_id: str, body: bytes, content_type: str, status: int, phrase: str, grpc: bool) -> None:
        """An error answer, whole, and the request released."""
        if grpc:  # GRPCJob ignores the status: the client reads the code in the body
            self.send(request_id, body, content_type, status, phrase, more=False)
            return
        self.send(request_id, body, content_type, status, phrase)  # a whole HTTP answer with its status
        self.send(request_id, b"", content_type, more=False)  # releases the request (its connection is closed)

    def new(self, request_id: str) -> bool:
        """Every request the frontend sends is new: it sends each once."""
        return True

    def settle(self) -> None:
        """Nothing to wait for: the frontend hands each request over as it arrives."""

    def close(self) -> None:
        """Nothing waits on the frontend."""


class StepReplies(Transport):
    """continuousBatching: the frontend sends the worker a batch (every request it holds for it,
    new ones whole, the others by id) and waits for one answer message, then sends the next batch.
    The pieces the engine writes between two batches go out together in that answer, one per
    request (a request's next piece waits for the next answer).

    The worker answers once per engine step (and at once when the reader has written something, a
    refusal or a new request's opening piece): the frontend hands over new requests only with its
    next batch, so a step must end in an answer even when it wrote nothing (a whole answer being
    generated writes nothing until its end), and never more than one, or the two would ping-pong
    empty answers while the engine computes.

    A request the worker has answered with a "true" piece is held by the frontend until a "false"
    one; when the frontend finds the client gone while sending it a piece, it forgets the request
    and leaves it out of the next batch (ContinuousBatching.sendResponse): that absence is how the
    worker learns a client went away (`batch` returns those ids; their later pieces are dropped,
    as the frontend would refuse them). So that a request waiting for a slot, or generating a
    whole answer, is checked too, every answer carries an empty "true" piece for each open
    request it has nothing else for (an empty chunk writes nothing to the client)."""

    def __init__(self, settle_s: float = SETTLE_S):
        self.settle_s = settle_s
        self.cond = threading.Condition()
        self.pending: list[tuple[str, bytes, bool | None, str]] = []  # (id, piece, more, type) until the answer
        self.held: set[str] = set()  # accepted, its last piece not yet sent
        self.opened: dict[str, str] = {}  # id -> content type: a "true" piece has been sent
        self.gone: set[str] = set()  # the frontend forgot them: their pieces are dropped
        self.batches = self.answers = 0  # batch n is answered by answer n
        self.steps = self.steps_answered = 0  # engine steps ended; the last one an answer followed
        self.closed = False  # the frontend has gone

    # -- the worker's reader thread ---------------------------------------------------------------
    def new(self, request_id: str) -> bool:
        """Whether a request of the batch is new (to be accepted), not one the worker holds."""
        with self.cond:
            if request_id in self.held:
                return False
            self.held.add(request_id)
            return True

    def batch(self, request_ids: Iterable[str]) -> list[str]:
        """A batch has been read: the open requests the frontend left out of it, whose clients went
        away. Their pending pieces are dropped, and any they are sent later."""
        with self.cond:
            gone = set(self.opened) - set(request_ids)
            for request_id in gone:
                del self.opened[request_id]
                self.held.discard(request_id)
            ended = {entry[0] for entry in self.pending if entry[0] in gone and not entry[2]}
            self.gone |= gone - ended  # an ended one's last piece is among those dropped here
            self.pending = [entry for entry in self.pending if entry[0] not in gone]
            return sorted(gone)

    def handled(self) -> None:
        """The batch's new requests are accepted and its gone ones cancelled: the engine may step."""
        with self.cond:
            self.batches += 1
            self.cond.notify_all()

    def answer(self) -> bytes:
        """The answer to the batch handled last: the pieces written since the last answer, once
        there is one or an engine step has ended since (an answer at once, with nothing, would
        have the frontend send the next batch at once, in a loop)."""
        with self.cond:
            while not self.pending and self.steps == self.steps_answered:
                self.cond.wait()
            self.steps_answered = self.steps
            # One piece per request an answer: the frontend forgets a request whose client it
            # finds gone while passing a piece on, and a second piece of it in the same answer
            # would then be unknown to it: "Unexpected job in sendResponse()", and it stops the
            # worker. The later pieces go in the next answers, or are dropped with the request.
            entries, later, answered = [], [], set()
            for entry in self.pending:
                (later if entry[0] in answered else entries).append(entry)
                answered.add(entry[0])
            self.pending = later
            keep_open = [
                prediction(request_id, b"", content_type, more=True)
                for request_id, content_type in self.opened.items()
                if request_id not in answered
            ]
            for request_id, _, more, content_type in entries:
                if more:
                    self.opened.setdefault(request_id, content_type)
                else:  # its last piece: the frontend forgets it
                    self.opened.pop(request_id, None)
                    self.held.discard(request_id)
            self.answers += 1
            self.cond.notify_all()
            return message([entry[1] for entry in entries] + keep_open)

    # -- any thread ----------------------------------------------------------------------------------
    def deliver(self, request_id: str, piece: bytes, more: bool | None, content_type: str) -> None:
        with self.cond:
            if request_id in self.gone:
                if not more:  # its sequence has ended: nothing more will come for it
                    self.gone.discard(request_id)
                return
            self.pending.append((request_id, piece, more, content_type))
            self.cond.notify_all()

    def refuse(self, request_id: str, body: bytes, content_type: str, status: int, phrase: str, grpc: bool) -> None:
        """An error answer, whole: the frontend forgets the request with it (no release needed)."""
        self.send(request_id, body, content_type, status, phrase, more=False if grpc else None)

    # -- the engine's thread -------------------------------------------------------------------------
    def settle(self) -> None:
        """After a step: have the worker answer it, and wait for the batch that followed the answer
        before (the previous step's), so that requests that reached the worker during this step
        join the next one, and sequences whose clients went away end in it (SETTLE_S). Not for
        this step's: its round trip would idle the cores every step (a few ms on 2 cores)."""
        deadline = time.monotonic() + self.settle_s
        with self.cond:
            target = self.answers + 1  # the worker has not answered this step yet: it waits for this call
            self.steps += 1
            self.cond.notify_all()
            while self.batches < target and not self.closed and (left := deadline - time.monotonic()) > 0:
                self.cond.wait(left)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
