"""handlers/generation/answers.py: answers in the kit's and OpenAI's shapes, whole and streamed."""

from __future__ import annotations

import json

from handlers.generation.answers import ANSWERS, DONE, Said, Usage, error_body
from handlers.generation.api import Api
from handlers.generation.logprobs import TokenLogprob
from handlers.generation.sequences import Finish
from tests.unit.handlers.generation.test_api import parsed


def events(stream: bytes) -> list:
    assert stream.endswith(DONE)
    chunks = stream[: -len(DONE)].split(b"\n\n")
    assert chunks[-1] == b"" and all(c.startswith(b"data: ") for c in chunks[:-1])
    return [json.loads(c[len(b"data: ") :]) for c in chunks[:-1]]


def test_a_streamed_chat_answer_is_what_openais_client_parses():
    request = parsed(
        Api.CHAT,
        {"messages": [{"role": "user", "content": "hi"}], "stream": True, "stream_options": {"include_usage": True}},
    )
    answer = ANSWERS[Api.CHAT]("r1", "lm", request)
    stream = (
        answer.first()
        + answer.chunk("Hel")
        + answer.chunk("lo")
        + answer.finished(Finish.LENGTH)
        + answer.closing(Usage(5, 2))
    )
    chunks = events(stream)
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 5
    assert {c["id"] for c in chunks} == {"chatcmpl-r1"}
    assert [c["choices"][0]["delta"] for c in chunks[:4]] == [
        {"role": "assistant", "content": ""},
        {"content": "Hel"},
        {"content": "lo"},
        {},
    ]
    assert chunks[3]["choices"][0]["finish_reason"] == "length"
    assert chunks[4]["choices"] == [] and chunks[4]["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
    }


def test_whole_answers_carry_usage_and_finish_reason():
    request = parsed(Api.COMPLETIONS, {"prompt": "x"})
    whole = ANSWERS[Api.COMPLETIONS]("r2", "lm", request).whole([Said("text", Finish.STOP)], Usage(1, 3))
    assert whole["object"] == "text_completion" and whole["choices"][0]["text"] == "text"
    assert whole["choices"][0]["finish_reason"] == "stop" and whole["usage"]["total_tokens"] == 4
    kit = ANSWERS[Api.KIT]("r3", "lm", parsed(Api.KIT, "x")).whole([Said("t", Finish.LENGTH)], Usage(1, 1))
    assert kit == {
        "text": "t",
        "finish_reason": "length",
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def test_errors_in_each_apis_shape():
    assert error_body(Api.KIT, "bad", 400) == {"code": 400, "type": "InvalidInput", "message": "bad"}
    assert error_body(Api.CHAT, "full", 503)["error"] == {
        "message": "full",
        "type": "server_error",
        "param": None,
        "code": None,
    }


def test_a_whole_answer_of_n_choices_has_each_at_its_index_and_the_usage_summed():
    request = parsed(Api.CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 2})
    whole = ANSWERS[Api.CHAT]("r4", "lm", request).whole(
        [Said("a", Finish.STOP), Said("bc", Finish.LENGTH)], Usage(3, 5)
    )
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in whole["choices"]] == [
        (0, "a", "stop"),
        (1, "bc", "length"),
    ]


ENTRIES = [
    TokenLogprob("He", -0.5, (("He", -0.5), ("A", -1.5))),
    TokenLogprob("llo", -0.25, (("llo", -0.25), ("y", -2.0))),
]


def test_chat_logprobs_in_openais_shape_streamed_and_whole():
    request = parsed(Api.CHAT, {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2})
    answer = ANSWERS[Api.CHAT]("r5", "lm", request)
    whole = answer.whole([Said("Hello", Finish.LENGTH, ENTRIES)], Usage(2, 2))
    content = whole["choices"][0]["logprobs"]["content"]
    assert content[1] == {
        "token": "llo",
        "logprob": -0.25,
        "bytes": [108, 108, 111],
        "top_logprobs": [
            {"token": "llo", "logprob": -0.25, "bytes": [108, 108, 111]},
            {"token": "y", "logprob": -2.0, "bytes": [121]},
        ],
    }
    (chunk,) = events(answer.chunk("He", 0, ENTRIES[:1]) + DONE)
    assert [e["token"] for e in chunk["choices"][0]["logprobs"]["content"]] == ["He"]
    plain = ANSWERS[Api.CHAT]("r6", "lm", parsed(Api.CHAT, {"messages": [{"role": "user", "content": "hi"}]}))
    assert "logprobs" not in plain.whole([Said("x", Finish.STOP)], Usage(1, 1))["choices"][0]


def test_completion_logprobs_count_text_offsets_across_chunks():
    answer = ANSWERS[Api.COMPLETIONS]("r7", "lm", parsed(Api.COMPLETIONS, {"prompt": "x", "logprobs": 1}))
    first, second = (events(answer.chunk(e.token, 0, [e]) + DONE)[0]["choices"][0]["logprobs"] for e in ENTRIES)
    assert first == {
        "tokens": ["He"],
        "token_logprobs": [-0.5],
        "top_logprobs": [{"He": -0.5, "A": -1.5}],
        "text_offset": [0],
    }
    assert second["text_offset"] == [2]
    whole = answer.whole([Said("Hello", Finish.STOP, ENTRIES)], Usage(1, 2))["choices"][0]["logprobs"]
    assert whole["tokens"] == ["He", "llo"] and whole["text_offset"] == [0, 2]


def test_usage_names_prompt_lookups_kept_and_refused_drafts_as_openai_does():
    """OpenAI's accepted / rejected_prediction_tokens, only where drafts were made; a request's
    choices share one prompt and sum the rest."""
    assert "completion_tokens_details" not in Usage(3, 4).as_dict()
    both = Usage(3, 4, 2, 5).plus(Usage(3, 6, 1, 0))
    assert both.as_dict() == {
        "prompt_tokens": 3,
        "completion_tokens": 10,
        "total_tokens": 13,
        "completion_tokens_details": {"accepted_prediction_tokens": 3, "rejected_prediction_tokens": 5},
    }
