"""handlers/replies.py: frames read back as TorchServe 0.12's frontend reads them
(util/codec/ModelResponseDecoder.java), over a real socket pair, from threads writing at once."""

from __future__ import annotations

import socket
import struct
import threading

from handlers.replies import Replies, answer_frame


class Reader:
    """ModelResponseDecoder, in Python: code, message, then per prediction id, content type,
    status, phrase, headers, body, until a length of -1."""

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def int(self) -> int:
        (value,) = struct.unpack_from("!i", self.data, self.at)
        self.at += 4
        return value

    def bytes(self, length: int) -> bytes:
        value = self.data[self.at : self.at + length]
        self.at += length
        return value

    def frame(self) -> tuple[int, list[dict]]:
        code = self.int()
        self.bytes(self.int())  # message
        predictions = []
        while (length := self.int()) != -1:
            request_id = self.bytes(length).decode()
            content_type = self.bytes(self.int()).decode()
            status = self.int()
            phrase = self.bytes(self.int()).decode()
            headers = {self.bytes(self.int()).decode(): self.bytes(self.int()).decode() for _ in range(self.int())}
            body = self.bytes(self.int())
            predictions.append(
                {
                    "id": request_id,
                    "type": content_type,
                    "status": status,
                    "phrase": phrase,
                    "headers": headers,
                    "body": body,
                }
            )
        return code, predictions

    @property
    def done(self) -> bool:
        return self.at == len(self.data)


def test_a_frame_holds_one_answer_and_the_stream_header_only_when_asked():
    code, (answer,) = Reader(answer_frame("r1", b"chunk", "text/plain", more=True)).frame()
    assert code == 200 and answer == {"id": "r1", "type": "text/plain", "status": 200, "phrase": "",
                                      "headers": {"ts_stream_next": "true"}, "body": b"chunk"}  # fmt: skip
    _, (last,) = Reader(answer_frame("r1", b"", "text/plain", more=False)).frame()
    assert last["headers"] == {"ts_stream_next": "false"} and last["body"] == b""
    _, (whole,) = Reader(answer_frame("r2", b"{}", "application/json", 400, "bad \u00e9 input")).frame()
    assert whole["headers"] == {} and whole["status"] == 400 and whole["phrase"] == "bad \\xe9 input"  # ASCII


def test_refusing_over_http_answers_whole_then_releases_over_grpc_once():
    left, right = socket.socketpair()
    with left, right:
        replies = Replies(left)
        replies.refuse("h", b"{}", "application/json", 400, "bad", grpc=False)
        replies.refuse("g", b"{}", "application/json", 400, "bad", grpc=True)
        left.shutdown(socket.SHUT_WR)
        reader = Reader(right.makefile("rb").read())
    frames = [reader.frame()[1][0] for _ in range(3)]
    assert reader.done
    assert [(f["id"], f["status"], f["headers"]) for f in frames] == [
        ("h", 400, {}),
        ("h", 200, {"ts_stream_next": "false"}),
        ("g", 400, {"ts_stream_next": "false"}),
    ]


def test_frames_from_threads_writing_at_once_never_interleave():
    left, right = socket.socketpair()
    received = bytearray()
    reader_thread = threading.Thread(target=lambda: received.extend(right.makefile("rb").read()))
    reader_thread.start()
    replies = Replies(left)
    body = b"x" * 100_000  # larger than a socket buffer: sendall writes it in pieces

    def write(name: str) -> None:
        for _ in range(20):
            replies.send(name, body, "text/plain", more=True)

    writers = [threading.Thread(target=write, args=(f"w{i}",)) for i in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    left.shutdown(socket.SHUT_WR)
    reader_thread.join()
    left.close()
    right.close()
    reader = Reader(bytes(received))
    ids = [reader.frame()[1][0]["id"] for _ in range(80)]
    assert reader.done and sorted(ids) == sorted(f"w{i}" for i in range(4) for _ in range(20))
