"""handlers/generation/respond.py: a sequence's text as the frames each transport needs."""

from __future__ import annotations

import json

import pytest

from handlers.generation.answers import ChatAnswer, KitAnswer, Usage
from handlers.generation.api import Api, Limits, parse
from handlers.generation.respond import Responder
from handlers.generation.sampling import Sampling
from handlers.generation.sequences import Finish


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


def respond(
    answer_class, stream: bool, grpc: bool, deltas: list[str], opened: bool = True
) -> list[tuple[bytes, str, bool | None]]:
    """The frames of an answer: opened when queued (as the handler does), or first by the engine."""
    replies = Recorded()
    responder = Responder(replies, "r1", answer_class("r1", "lm", request(stream)), stream, grpc)
    if opened:
        responder.open()
    for delta in deltas:
        responder.text(delta)
    responder.finish(Finish.LENGTH, Usage(2, len(deltas)))
    if opened:
        responder.open()  # late, from the reader thread: nothing more
    return replies.frames


@pytest.mark.parametrize("opened", [True, False], ids=["opened-when-queued", "opened-by-the-engine"])
def test_http_streamed_opens_then_a_frame_per_delta_then_the_end(opened):
    frames = respond(KitAnswer, True, False, ["Hel", "lo"], opened)
    assert [(body, more) for body, _, more in frames] == [(b"", True), (b"Hel", True), (b"lo", True), (b"", False)]
    assert {content_type for _, content_type, _ in frames} == {"text/plain; charset=utf-8"}


@pytest.mark.parametrize("grpc", [False, True], ids=["http", "grpc"])
def test_whole_is_one_body_and_over_grpc_one_message(grpc):
    frames = respond(KitAnswer, False, grpc, ["Hel", "lo"])
    # HTTP: opened (empty) when queued, so that the frontend can tell the worker a client went
    # away; the body in the frame that ends it. gRPC: one message, since a second to a Predictions
    # call would end the frontend's connection to the worker.
    assert [more for _, _, more in frames] == ([False] if grpc else [True, False])
    assert json.loads(frames[-1][0]) == {"text": "Hello", "finish_reason": "length", "usage": Usage(2, 2).as_dict()}
    assert grpc or frames[0][0] == b"" and {t for _, t, _ in frames} == {"application/json"}


def test_a_streamed_chat_opens_with_its_role_chunk_before_any_token():
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    chat = parse(Api.CHAT, body, Limits(32, 8, Sampling()), lambda text: [ord(c) for c in text], lambda m, t, o: [1, 2])
    replies = Recorded()
    responder = Responder(replies, "r1", ChatAnswer("r1", "lm", chat), True, False)
    responder.open()
    assert len(replies.frames) == 1 and replies.frames[0][1] == "text/event-stream"
    opening = json.loads(replies.frames[0][0].removeprefix(b"data: "))
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def chat(n: int, stream: bool):
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": stream, "n": n}
    return parse(Api.CHAT, body, Limits(32, 8, Sampling()), lambda text: [ord(c) for c in text], lambda m, t, o: [1, 2])


def test_n_choices_stream_interleaved_each_at_its_index_and_end_after_the_last():
    replies = Recorded()
    responder = Responder(replies, "r1", ChatAnswer("r1", "lm", chat(2, True)), True, False, choices=2)
    first, second = responder.choice(0), responder.choice(1)
    responder.open()
    first.text("a")
    second.text("b")
    second.finish(Finish.STOP, Usage(2, 1))
    first.text("c")
    first.finish(Finish.LENGTH, Usage(2, 2))
    bodies = b"".join(body for body, _, _ in replies.frames)
    events = [json.loads(e.removeprefix(b"data: ")) for e in bodies.split(b"\n\n") if e and e != b"data: [DONE]"]
    choices = [(c["index"], c["delta"].get("content"), c["finish_reason"]) for e in events for c in e["choices"]]
    assert choices == [
        (0, "", None),
        (1, "", None),
        (0, "a", None),
        (1, "b", None),
        (1, None, "stop"),
        (0, "c", None),
    ] + [(0, None, "length")]
    assert [more for _, _, more in replies.frames] == [True] * 5 + [False] and bodies.endswith(b"data: [DONE]\n\n")


def test_n_choices_whole_is_one_body_once_the_last_has_ended():
    replies = Recorded()
    responder = Responder(replies, "r1", ChatAnswer("r1", "lm", chat(2, False)), False, False, choices=2)
    responder.open()
    responder.choice(1).text("b")
    responder.choice(1).finish(Finish.STOP, Usage(2, 1))
    assert [body for body, _, _ in replies.frames] == [b""]  # nothing until the last choice ends
    responder.choice(0).text("a")
    responder.choice(0).finish(Finish.LENGTH, Usage(2, 3))
    whole = json.loads(replies.frames[-1][0])
    assert [c["message"]["content"] for c in whole["choices"]] == ["a", "b"] and replies.frames[-1][2] is False
    assert whole["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


@pytest.mark.parametrize("grpc", [False, True], ids=["http", "grpc"])
def test_an_answer_without_the_engine_is_opened_then_whole_or_one_grpc_message(grpc):
    from handlers.generation.answers import model_list
    from handlers.generation.respond import answer_whole

    replies = Recorded()
    answer_whole(replies, "r1", model_list("lm", 2048), grpc)
    assert [more for _, _, more in replies.frames] == ([False] if grpc else [True, False])
    listed = json.loads(replies.frames[-1][0])
    assert listed["object"] == "list" and [(m["id"], m["max_model_len"]) for m in listed["data"]] == [("lm", 2048)]


def tool_request(stream: bool):
    from handlers.generation.tools import FORMATS, Syntax

    limits = Limits(256, 8, Sampling(), tools=FORMATS[Syntax.HERMES])
    tools = [{"type": "function", "function": {"name": "weather"}}]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, "stream": stream}
    return parse(Api.CHAT, body, limits, lambda text: [ord(c) for c in text], lambda m, t, o: [1, 2])


CALLING = ["Checking.\n<tool_", 'call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>']


def test_a_streamed_answers_calls_come_as_tool_call_deltas_and_it_ends_for_tool_calls():
    replies = Recorded()
    responder = Responder(replies, "r1", ChatAnswer("r1", "lm", tool_request(True)), True, False)
    for delta in CALLING:
        responder.text(delta)
    responder.finish(Finish.STOP, Usage(2, 9))
    chunks = [
        json.loads(line[6:])
        for body, _, _ in replies.frames
        for line in body.decode().split("\n\n")
        if line.startswith("data: {")
    ]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content", "") for d in deltas) == "Checking.\n"  # "<tool_" was held back
    (calls,) = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (0, "weather", {"city": "Oslo"})
    ]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_whole_answers_calls_are_its_messages_tool_calls():
    replies = Recorded()
    responder = Responder(replies, "r1", ChatAnswer("r1", "lm", tool_request(False)), False, False)
    for delta in CALLING:
        responder.text(delta)
    responder.finish(Finish.STOP, Usage(2, 9))
    (choice,) = json.loads(replies.frames[-1][0])["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Checking."
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["weather"]
