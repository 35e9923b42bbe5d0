"""handlers/replies.py: frames read back as TorchServe 0.12's frontend reads them
(util/codec/ModelResponseDecoder.java), over a real socket pair, from threads writing at once;
continuousBatching's answers (StepReplies) as the frontend's batches and answers alternate."""

from __future__ import annotations

import socket
import struct
import threading
import time

from handlers.replies import Replies, StepReplies, answer_frame


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
    assert code == 200 and answer == {
        "id": "r1",
        "type": "text/plain",
        "status": 200,
        "phrase": "",
        "headers": {"ts_stream_next": "true"},
        "body": b"chunk",
    }
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


def answered(replies: StepReplies) -> list[tuple[str, bytes, dict]]:
    """The next answer's pieces, as the frontend reads them: (id, body, headers)."""
    code, pieces = Reader(replies.answer()).frame()
    assert code == 200
    return [(p["id"], p["body"], p["headers"]) for p in pieces]


OPEN, END = {"ts_stream_next": "true"}, {"ts_stream_next": "false"}


def test_a_batch_is_answered_once_with_a_piece_per_request_written_since_the_last_answer():
    replies = StepReplies()
    assert replies.new("a") and replies.new("b") and not replies.new("a")  # a batch repeats what it holds
    replies.send("a", b"", "text/plain", more=True)
    replies.send("a", b"Hel", "text/plain", more=True)
    replies.send("b", b"{}", "application/json", 400, "bad")  # a refusal: whole, the frontend forgets it
    assert answered(replies) == [("a", b"", OPEN), ("b", b"{}", {})]
    assert replies.new("b")  # forgotten by both sides: an id seen again is a new request
    replies.send("a", b"lo", "text/plain", more=False)
    assert answered(replies) == [("a", b"Hel", OPEN)]  # a's second piece, then its third: in order
    assert answered(replies) == [("a", b"lo", END)]
    assert not replies.opened and replies.held == {"b"}


def test_a_request_gone_while_its_pieces_wait_loses_the_rest():
    """The frontend forgets a request when it finds the client gone passing a piece on: a second
    piece of it in the same answer would be unknown to it (TorchServe 0.12 then stops the worker),
    so it waits for the next answer and, the request left out of the next batch, is dropped."""
    replies = StepReplies(settle_s=0.1)
    replies.new("a")
    replies.send("a", b"", "text/plain", more=True)
    replies.send("a", b"Hel", "text/plain", more=True)
    replies.send("a", b"lo", "text/plain", more=False)
    assert answered(replies) == [("a", b"", OPEN)]
    assert replies.batch([]) == ["a"]  # the client went away: a is not in the next batch
    waiter, got = answer_later(replies)
    replies.settle()  # an engine step ended: its answer has nothing of a's
    waiter.join(timeout=5)
    assert got == [[]] and not replies.pending


def answer_later(replies: StepReplies) -> tuple[threading.Thread, list]:
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(answered(replies)))
    waiter.start()
    return waiter, got


def test_an_answer_waits_for_a_piece_or_the_end_of_a_step():
    replies = StepReplies(settle_s=0.1)
    waiter, got = answer_later(replies)
    time.sleep(0.2)
    assert got == []  # an empty answer at once would have the frontend send the next batch at once, in a loop
    replies.send("a", b"x", "text/plain", more=True)
    waiter.join(timeout=5)
    assert got == [[("a", b"x", OPEN)]]
    waiter, got = answer_later(replies)
    replies.settle()  # a step ended having written nothing (a's answer is whole, say): answered all the same
    waiter.join(timeout=5)
    assert got == [[("a", b"", OPEN)]]  # with a's piece that lets the frontend check its client
    waiter, got = answer_later(replies)
    time.sleep(0.2)
    assert got == []  # that step is answered: the next answer waits for the next
    replies.settle()
    waiter.join(timeout=5)
    assert len(got) == 1


def test_an_open_request_left_out_of_a_batch_has_gone_and_its_pieces_are_dropped():
    replies = StepReplies()
    for request_id in ("a", "b", "g"):
        replies.new(request_id)
    replies.send("a", b"", "text/plain", more=True)
    replies.send("b", b"", "application/json", more=True)
    answered(replies)
    replies.send("a", b"tok", "text/plain", more=True)  # written before the frontend's next batch
    # The frontend found a's client gone when it passed a piece on, and left a out; g (gRPC) was
    # never opened, so only its own last piece tells anything of it.
    assert replies.batch(["b", "g"]) == ["a"]
    replies.send("a", b"more", "text/plain", more=True)
    replies.send("a", b"", "text/plain", more=False)  # its sequence ends (cancelled): forgotten
    replies.send("g", b"{}", "application/json", more=False)
    # b, open and silent, gets an empty piece: the frontend checks its client with it.
    assert answered(replies) == [("g", b"{}", END), ("b", b"", OPEN)]
    assert replies.gone == set() and "a" not in replies.held
    replies.send("b", b"{}", "application/json", more=False)  # b ends as its client leaves
    assert replies.batch([]) == ["b"] and replies.gone == set()  # nothing more will come for it


def test_refusals_are_whole_over_http_and_end_the_call_over_grpc():
    replies = StepReplies()
    replies.refuse("h", b"{}", "application/json", 400, "bad", grpc=False)
    replies.refuse("g", b"{}", "application/json", 400, "bad", grpc=True)
    assert answered(replies) == [("h", b"{}", {}), ("g", b"{}", END)]


def test_the_engine_waits_for_the_batch_that_followed_the_previous_steps_answer():
    replies = StepReplies(settle_s=30)
    replies.new("a")  # batch 1 brings a
    replies.batch(["a"])
    replies.handled()
    replies.send("a", b"", "text/plain", more=True)
    replies.settle()  # step 1: nothing answered before it, so no batch to wait for
    answered(replies)  # answer 1: step 1's pieces; the frontend's batch 2 follows it
    settled = threading.Event()
    engine = threading.Thread(target=lambda: (replies.settle(), settled.set()))  # step 2 ends
    engine.start()
    time.sleep(0.2)
    assert not settled.is_set()  # batch 2, perhaps with new requests for step 3, is not handled yet
    replies.batch(["a"])
    replies.handled()
    engine.join(timeout=2)  # at once, not after settle_s
    assert settled.is_set()
    assert answered(replies) == [("a", b"", OPEN)]  # step 2's answer, sent while step 3 computes


def test_settling_gives_up_after_its_time():
    replies = StepReplies(settle_s=0.2)
    started = time.monotonic()
    replies.settle()  # nobody answers: the frontend holds no request of this worker
    assert 0.15 < time.monotonic() - started < 2
