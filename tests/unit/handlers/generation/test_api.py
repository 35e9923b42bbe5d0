"""handlers/generation/api.py: request bodies checked by name, answers in OpenAI's shapes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from handlers.generation.api import Api, Limits, parse
from handlers.generation.sampling import Sampling
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
    with pytest.raises(InvalidInput, match=message) as refused:
        parsed(api, body)
    # The reason the metrics port counts it under (kit_requests_total's outcome).
    assert refused.value.reason == ("too_long" if "context is" in message else "bad_input")


def test_chat_on_a_model_without_a_template_says_which_endpoint_serves_it():
    with pytest.raises(InvalidInput, match="no chat template .* use v1/completions"):
        parsed(Api.CHAT, {"messages": [{"role": "user", "content": "hi"}]}, apply=None)


def test_n_choices_each_draw_with_a_seed_of_their_own():
    request = parsed(Api.CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 3, "seed": 7, "temperature": 1})
    assert [g.sampling.seed for g in request.generations()] == [7, 8, 9]
    assert {g.prompt for g in request.generations()} == {request.generation.prompt}
    greedy = parsed(Api.COMPLETIONS, {"prompt": "x", "n": 2})
    assert greedy.generations() == [greedy.generation] * 2


def test_logprobs_asked_for_are_alternatives_per_token():
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert parsed(Api.CHAT, {**chat, "logprobs": True, "top_logprobs": 3}).generation.logprobs == 3
    assert parsed(Api.CHAT, {**chat, "logprobs": True}).generation.logprobs == 0
    assert parsed(Api.CHAT, {**chat, "logprobs": False}).generation.logprobs is None
    assert parsed(Api.COMPLETIONS, {"prompt": "x", "logprobs": 2}).generation.logprobs == 2
    assert parsed(Api.COMPLETIONS, {"prompt": "x"}).generation.logprobs is None


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
