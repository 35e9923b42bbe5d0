"""handlers/generation/tools.py: a family's tool-call format found from its template, a request's tools
checked, and an answer's calls read from its text as it streams."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from bench.example_models import CHATML
from handlers.generation.grammar import Grammars
from handlers.generation.tools import FORMATS, CallStream, Choice, Syntax, Tools, detect, template_calls
from handlers.payload import InvalidInput
from tests.hf_models import qwen2_lm

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}, "celsius": {"type": "boolean"}},
            "required": ["city", "celsius"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
HERMES, MISTRAL, LLAMA3 = (FORMATS[s] for s in Syntax)


@pytest.mark.parametrize(
    ("template", "named", "want"),
    [
        (CHATML, None, Syntax.HERMES),
        ("{% if tools %}[AVAILABLE_TOOLS]{% endif %}{{ '[TOOL_CALLS]' }}", None, Syntax.MISTRAL),
        ("{% if tools %}{{ '<|python_tag|>' }}{% endif %}", None, Syntax.LLAMA3_JSON),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", None, None),  # shows no tools
        ("{% for m in messages %}{{ m.content }}{% endfor %}", Syntax.HERMES, Syntax.HERMES),  # the settings say
        (None, None, None),
    ],
)
def test_the_format_is_the_settings_or_the_templates(template, named, want):
    found = detect(template, named)
    assert (found and found.syntax) == want


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"tool_choice": "required"}, "tool_choice 'required' needs tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "names function 'f'"),
        ({"tools": [WEATHER, WEATHER]}, "name a function twice"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, r"tools\[0\].function.name must be"),
        ({"tools": [{"type": "code"}]}, r"tools\[0\] must be"),
        ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice must be"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls must be true or false"),
    ],
)
def test_bad_tools_are_refused_naming_what_is_wrong(body, message):
    with pytest.raises(InvalidInput, match=message):
        Tools.parse(body, HERMES)


def test_a_template_without_tools_names_the_setting_that_gives_them():
    with pytest.raises(InvalidInput, match="tool_format: one of hermes, mistral, llama3_json"):
        Tools.parse({"tools": [WEATHER]}, None)
    assert Tools.parse({"tools": [WEATHER], "tool_choice": "none"}, None) is None  # none: as if no tools
    assert Tools.parse({"tools": []}, None) is None


def test_the_choice_says_what_is_forced_and_what_the_answer_opens_with():
    auto = Tools.parse({"tools": [WEATHER, TIME]}, HERMES)
    assert (auto.choice, auto.forced, auto.prefix) == (Choice.AUTO, False, "")
    named = Tools.parse(
        {"tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, HERMES
    )
    assert (named.forced, named.prefix) == (True, "<tool_call>\n")
    assert [c["properties"]["name"] for c in named.schema()["anyOf"]] == [{"const": "get_time"}]
    required = Tools.parse({"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": False}, MISTRAL)
    assert required.schema()["maxItems"] == 1 and len(required.schema()["items"]["anyOf"]) == 2


def read(tools: Tools, deltas: list[str]) -> tuple[list[str], list, list]:
    """What a stream passes on: the content pieces, the calls as they come, and those at the end."""
    stream, content, calls = CallStream(tools), [], []
    for delta in deltas:
        text, new = stream.feed(delta)
        content.append(text)
        calls.append([(c.name, json.loads(c.arguments)) for c in new])
    text, new = stream.close()
    return [*content, text], calls, [(c.name, json.loads(c.arguments)) for c in new]


def test_hermes_content_streams_until_a_call_and_each_call_comes_when_its_block_ends():
    tools = Tools.parse({"tools": [WEATHER]}, HERMES)
    deltas = [
        "Let me",
        " look.\n<to",
        'ol_call>\n{"name": "get_weather", ',
        '"arguments": {"city": "Oslo"}}\n</tool',
        "_call>",
    ]
    content, calls, last = read(tools, deltas)
    # "<to" is held back: it may open a call (it does)
    assert content == ["Let me", " look.\n", "", "", "", ""]
    assert calls[-1] == [("get_weather", {"city": "Oslo"})] and not any(calls[:-1]) and last == []


def test_text_that_only_looked_like_a_marker_is_released():
    content, calls, last = read(Tools.parse({"tools": [WEATHER]}, HERMES), ["a <to", "day", " b"])
    assert "".join(content) == "a <today b" and content[0] == "a " and not any(calls) and last == []


def test_a_forced_answer_is_read_with_the_marker_the_prompt_ended_with():
    tools = Tools.parse({"tools": [WEATHER], "tool_choice": "required"}, HERMES)
    content, _, last = read(tools, ['{"name":"get_weather",', '"arguments":{"city":"Paris","celsius":true}}'])
    assert "".join(content) == "" and last == [("get_weather", {"city": "Paris", "celsius": True})]


def test_a_forced_answer_cut_short_is_content_without_the_marker_the_prompt_ended_with():
    tools = Tools.parse({"tools": [WEATHER], "tool_choice": "required"}, HERMES)
    content, _, last = read(tools, ['{"name":"get_weather",', '"argu'])  # max_tokens reached
    assert "".join(content) == '{"name":"get_weather","argu' and last == []


@pytest.mark.parametrize(
    ("format", "text", "want"),
    [
        (
            MISTRAL,
            '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]',
            [("a", {"x": 1}), ("b", {})],
        ),
        (
            LLAMA3,
            '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
            [("a", {"x": 1}), ("b", {})],
        ),
        (LLAMA3, ' {"name": "a", "parameters": "{\\"x\\": 2}"}', [("a", {"x": 2})]),  # arguments as JSON text
    ],
)
def test_other_families_calls_are_read_at_the_end(format, text, want):
    content, calls, last = read(Tools.parse({"tools": [WEATHER]}, format), [text[:9], text[9:]])
    assert "".join(content).strip() == "" and not any(calls) and last == want


@pytest.mark.parametrize("format", [HERMES, MISTRAL, LLAMA3])
def test_something_not_a_call_where_a_call_should_be_is_the_answer(format):
    text = {HERMES: "x <tool_call>{oops</tool_call>", MISTRAL: "[TOOL_CALLS][oops", LLAMA3: "{oops"}[format]
    content, calls, last = read(Tools.parse({"tools": [WEATHER]}, format), [text])
    assert "".join(content) == text and not any(calls) and last == []


def test_an_assistants_calls_go_back_to_the_template_with_object_arguments():
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    assert template_calls(2, calls) == [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}, "id": "call_1"}
    ]
    with pytest.raises(InvalidInput, match=r"messages\[2\].tool_calls: arguments of 'f' are not a JSON object"):
        template_calls(2, [{"function": {"name": "f", "arguments": "[1"}}])


def test_a_forced_calls_grammar_makes_random_logits_a_valid_call(tmp_path):
    """Every answer the grammar allows is a call of an offered function whose arguments validate."""
    directory = qwen2_lm(tmp_path)
    tokenizer, config = AutoTokenizer.from_pretrained(directory), AutoConfig.from_pretrained(directory)
    grammars = Grammars(tokenizer, config.vocab_size, {config.eos_token_id})
    tools = Tools.parse({"tools": [WEATHER, TIME], "tool_choice": "required"}, HERMES)
    for seed in range(4):
        matcher = grammars.constraint(json.dumps(tools.schema()), "tool_choice").matcher()
        generator, stream, tokens = torch.Generator().manual_seed(seed), CallStream(tools), []
        for _ in range(64):
            token = int(torch.argmax(matcher.masked(torch.randn(config.vocab_size, generator=generator))))
            if token == config.eos_token_id:
                break
            matcher.accept(token)
            tokens.append(token)
        stream.feed(tokenizer.decode(tokens))
        _, (call,) = stream.close()
        arguments = json.loads(call.arguments)
        if call.name == "get_weather":
            jsonschema.validate(arguments, WEATHER["function"]["parameters"])
        assert call.name in ("get_weather", "get_time") and isinstance(arguments, dict)
