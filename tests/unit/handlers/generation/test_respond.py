"""handlers/generation/respond.py: a sequence's text as the frames each transport needs."""

from __future__ import annotations

import json

import pytest

from handlers.generation.api import Api, KitAnswer, Limits, Usage, parse
from handlers.generation.engine import Finish
from handlers.generation.respond import Responder
from handlers.generation.sampling import Sampling


class Recorded:
    """The frames a Responder sends, as (body, content type, more)."""

    def __init__(self):
        self.frames: list[tuple[bytes, str, bool | None]] = []

    def send(self, request_id, body, content_type, status=200, phrase="", more=None):
        assert request_id == "r1"
        self.frames.append((body, content_type, more))


def request(stream: bool):
    body = {"prompt": "hi", "stream": stream}
    return parse(Api.KIT, body, Limits(32, 8, Sampling()), lambda text: [ord(c) for c in text], None)


def respond(answer_class, stream: bool, grpc: bool, deltas: list[str]) -> list[tuple[bytes, str, bool | None]]:
    replies = Recorded()
    responder = Responder(replies, "r1", answer_class("r1", "lm", request(stream)), stream, grpc)
    for delta in deltas:
        responder.text(delta)
    responder.finish(Finish.LENGTH, 2, len(deltas))
    return replies.frames


def test_http_streamed_is_a_frame_per_delta_then_the_end():
    frames = respond(KitAnswer, True, False, ["Hel", "lo"])
    assert [(body, more) for body, _, more in frames] == [(b"Hel", True), (b"lo", True), (b"", False)]


@pytest.mark.parametrize("grpc", [False, True], ids=["http", "grpc"])
def test_whole_is_one_body_and_over_grpc_one_message(grpc):
    frames = respond(KitAnswer, False, grpc, ["Hel", "lo"])
    assert json.loads(frames[0][0]) == {"text": "Hello", "finish_reason": "length", "usage": Usage(2, 2).as_dict()}
    # HTTP: an empty "false" frame releases the request after the answer; gRPC: a second
    # message to a Predictions call would end the frontend's connection to the worker.
    assert [more for _, _, more in frames] == ([False] if grpc else [True, False])
