"""handlers/generation/api.py: request bodies checked by name, answers in OpenAI's shapes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from handlers.generation.api import (
    ANSWERS,
    DONE,
    Api,
    Limits,
    Said,
    Usage,
    error_body,
    parse,
)
from handlers.generation.logprobs import TokenLogprob
from handlers.generation.sampling import Sampling
from handlers.generation.scheduler import Finish
from handlers.payload import InvalidInput

LIMITS = Limits(context=32, max_new_tokens=10, sampling=Sampling())


def tokenize(text: str) -> list[int]:
    return [ord(c) for c in text]  # one token per character: lengths are easy to reason about


def template(messages: list[dict], tools=None, opening: str = "") -> list[int]:
    shown = "".join(f"<tool {t['function']['name']}>" for t in tools or ())
    return tokenize(shown + "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>" + opening)


def parsed(api: Api, body, apply=template):
    return parse(api, body, LIMITS, tokenize, apply)


def test_the_kits_api_takes_a_bare_text_or_json_with_parameters():
    request = parsed(Api.KIT, "hello")
    assert request.generation.prompt == tuple(tokenize("hello")) and request.generation.max_new_tokens == 10
    request = parsed(Api.KIT, {"prompt": "hi", "max_new_tokens": 3, "stop": ".", "temperature": 0.5, "stream": True})
    assert request.generation.max_new_tokens == 3 and request.generation.stop == (".",) and request.stream
    assert request.generation.sampling.temperature == 0.5


def test_openai_names_and_the_chat_template():
    completion = parsed(Api.COMPLETIONS, {"prompt": ["once"], "max_tokens": 4, "stop": ["\n", "END"]})
    assert completion.generation.prompt == tuple(tokenize("once")) and completion.generation.stop == ("\n", "END")
    chat = parsed(
        Api.CHAT,
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert chat.generation.prompt == tuple(tokenize("<user>hi<assistant>")) and chat.generation.max_new_tokens == 2
    assert chat.stream and chat.include_usage


@pytest.mark.parametrize(
    ("api", "body", "message"),
    [
        (Api.KIT, "   ", "prompt is empty"),
        (Api.KIT, {"text": ""}, "prompt is empty"),
        (Api.KIT, {"prompt": "x" * 32}, "prompt is 32 tokens; this model's context is 32 tokens"),
        (Api.KIT, {"prompt": "x", "max_new_tokens": 0}, "max_new_tokens must be from 1 to 32, got 0"),
        (Api.KIT, {"prompt": "x", "stop": [1]}, "stop must be a string or a list of at most 8 strings"),
        (Api.KIT, {"prompt": "x", "stream": "yes"}, "stream must be true or false"),
        (Api.KIT, [1, 2], "body must be a JSON object, got a JSON list"),
        (Api.COMPLETIONS, {"prompt": "x", "n": 17}, "n must be from 1 to 16, got 17"),
        (Api.KIT, {"prompt": "x", "n": 2}, "unknown field 'n'"),
        (Api.COMPLETIONS, {"prompt": "x", "logprobs": 21}, "logprobs must be from 0 to 20, got 21"),
        (Api.CHAT, {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs needs logprobs"),
        (Api.COMPLETIONS, {"max_tokens": 3}, 'JSON body needs a string field "prompt"'),
        (Api.COMPLETIONS, {"messages": []}, "unknown field 'messages'; this endpoint takes best_of, echo, "),
        (Api.CHAT, {"messages": []}, 'chat needs "messages": a non-empty list'),
        (Api.CHAT, {"messages": [{"content": "x"}]}, 'messages\\[0\\] must be an object with a string "role"'),
        (Api.CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text parts are served"),
    ],
)
def test_a_bad_request_is_refused_naming_the_problem(api, body, message):
    with pytest.raises(InvalidInput, match=message):
        parsed(api, body)


def test_chat_on_a_model_without_a_template_says_which_endpoint_serves_it():
    with pytest.raises(InvalidInput, match="no chat template .* use v1/completions"):
        parsed(Api.CHAT, {"messages": [{"role": "user", "content": "hi"}]}, apply=None)


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


def test_n_choices_each_draw_with_a_seed_of_their_own():
    request = parsed(Api.CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 3, "seed": 7, "temperature": 1})
    assert [g.sampling.seed for g in request.generations()] == [7, 8, 9]
    assert {g.prompt for g in request.generations()} == {request.generation.prompt}
    greedy = parsed(Api.COMPLETIONS, {"prompt": "x", "n": 2})
    assert greedy.generations() == [greedy.generation] * 2


def test_a_whole_answer_of_n_choices_has_each_at_its_index_and_the_usage_summed():
    request = parsed(Api.CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 2})
    whole = ANSWERS[Api.CHAT]("r4", "lm", request).whole(
        [Said("a", Finish.STOP), Said("bc", Finish.LENGTH)], Usage(3, 5)
    )
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in whole["choices"]] == [
        (0, "a", "stop"),
        (1, "bc", "length"),
    ]


def test_logprobs_asked_for_are_alternatives_per_token():
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert parsed(Api.CHAT, {**chat, "logprobs": True, "top_logprobs": 3}).generation.logprobs == 3
    assert parsed(Api.CHAT, {**chat, "logprobs": True}).generation.logprobs == 0
    assert parsed(Api.CHAT, {**chat, "logprobs": False}).generation.logprobs is None
    assert parsed(Api.COMPLETIONS, {"prompt": "x", "logprobs": 2}).generation.logprobs == 2
    assert parsed(Api.COMPLETIONS, {"prompt": "x"}).generation.logprobs is None


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


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


class FakeGrammars:
    """What the parser asks of grammar.py: the schemas compiled, by the field that asked."""

    def __init__(self):
        self.asked: list[tuple[dict, str]] = []

    def parse(self, response_format):
        return None if response_format in (None, {"type": "text"}) else "answer-grammar"

    def constraint(self, schema: str, asker: str):
        self.asked.append((json.loads(schema), asker))
        return "call-grammar"


def test_tools_are_shown_to_the_template_and_a_forced_call_opens_the_answer_under_a_grammar():
    from handlers.generation.tools import FORMATS, Syntax

    limits = Limits(context=256, max_new_tokens=10, sampling=Sampling(), tools=FORMATS[Syntax.HERMES])
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    grammars = FakeGrammars()
    auto = parse(Api.CHAT, body, limits, tokenize, template, grammars)
    assert auto.tools.choice == "auto" and auto.generation.constraint is None and not grammars.asked
    assert auto.generation.prompt == tuple(tokenize("<tool weather><user>hi<assistant>"))
    forced = parse(Api.CHAT, {**body, "tool_choice": "required"}, limits, tokenize, template, grammars)
    assert forced.generation.prompt == tuple(tokenize("<tool weather><user>hi<assistant><tool_call>\n"))
    assert forced.generation.constraint == "call-grammar" and grammars.asked[0][1] == "tool_choice"
    none = parse(Api.CHAT, {**body, "tool_choice": "none"}, limits, tokenize, template, grammars)
    assert none.tools is None and none.generation.prompt == tuple(tokenize("<user>hi<assistant>"))
    with pytest.raises(InvalidInput, match="response_format cannot go with tool_choice required"):
        parse(
            Api.CHAT,
            {**body, "tool_choice": "required", "response_format": {"type": "json_object"}},
            limits,
            tokenize,
            template,
            grammars,
        )
    unserved = dataclasses.replace(limits, unserved=frozenset({"tool_choice"}), backend="openvino")
    with pytest.raises(InvalidInput, match="tool_choice is not served by the openvino backend"):
        parse(Api.CHAT, {**body, "tool_choice": "required"}, unserved, tokenize, template, None)
    assert parse(Api.CHAT, body, unserved, tokenize, template, None).tools.choice == "auto"


def test_an_assistants_calls_and_a_tools_answer_go_back_through_the_template():
    seen = []
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    parsed(Api.CHAT, {"messages": messages}, lambda m, tools, opening: seen.extend(m) or [1])
    assert seen[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
        ],
    }
    assert seen[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    with pytest.raises(InvalidInput, match=r"messages\[0\]: only an assistant's message holds tool_calls"):
        parsed(Api.CHAT, {"messages": [{"role": "user", "content": "x", "tool_calls": [{}]}]})
