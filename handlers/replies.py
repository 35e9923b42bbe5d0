"""Answer frames a handler writes to the frontend itself (TorchServe's asyncCommunication).

    replies = Replies(socket)
    replies.send(request_id, b"chunk", "text/plain", more=True)     # one piece of a stream
    replies.send(request_id, b"", "text/plain", more=False)         # the request is answered

The frame is TorchServe 0.12's predict response holding one request. Its `ts_stream_next`
header decides what the frontend does (wlm/AsyncBatchAggregator, job/RestJob, job/GRPCJob):
- "true": an HTTP answer is opened (status and headers from this frame) or continued, chunked;
- "false": the request is done and forgotten. Without it the frontend keeps the request forever
  (a leak) and an HTTP answer made of frames without the header is never closed;
- no header: a whole HTTP answer, of any status (a 4xx closes the connection after it).
A frame's top-level code stays 200: any other would fail every request the worker holds.
Several threads answer at once (the engine, the reader refusing a bad request): one lock.
"""

from __future__ import annotations

import socket
import struct
import threading

from handlers.payload import status_phrase

SUCCESS = b"Prediction success"


def _field(data: bytes) -> bytes:
    return struct.pack("!i", len(data)) + data


def answer_frame(
    request_id: str, body: bytes, content_type: str, status: int = 200, phrase: str = "", more: bool | None = None
) -> bytes:
    """more: True/False sets ts_stream_next; None leaves it out (a whole answer)."""
    headers = {} if more is None else {"ts_stream_next": "true" if more else "false"}
    frame = struct.pack("!i", 200) + _field(SUCCESS) + _field(request_id.encode())
    frame += _field(content_type.encode()) + struct.pack("!i", status) + _field(status_phrase(phrase).encode())
    frame += struct.pack("!i", len(headers))
    for key, value in headers.items():
        frame += _field(key.encode()) + _field(value.encode())
    return frame + _field(body) + struct.pack("!i", -1)


class Replies:
    def __init__(self, connection: socket.socket):
        self.connection = connection
        self.lock = threading.Lock()

    def send(
        self,
        request_id: str,
        body: bytes,
        content_type: str,
        status: int = 200,
        phrase: str = "",
        more: bool | None = None,
    ) -> None:
        frame = answer_frame(request_id, body, content_type, status, phrase, more)
        with self.lock:
            self.connection.sendall(frame)

    def refuse(self, request_id: str, body: bytes, content_type: str, status: int, phrase: str, grpc: bool) -> None:
        """An error answer, whole, and the request released."""
        if grpc:  # GRPCJob ignores the status: the client reads the code in the body
            self.send(request_id, body, content_type, status, phrase, more=False)
            return
        self.send(request_id, body, content_type, status, phrase)  # a whole HTTP answer with its status
        self.send(request_id, b"", content_type, more=False)  # releases the request (its connection is closed)
