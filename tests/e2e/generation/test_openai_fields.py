"""Every field of OpenAI's chat schema served or refused by name, with the official `openai`
client: penalties, logit bias and log-probabilities as transformers computes them, a strict JSON
schema answered valid, forced tool calls whose arguments validate and whose answers go back."""

from __future__ import annotations

import json

import pytest
import torch

from tests.e2e.generation.conftest import QWEN
from tests.e2e.language_models import CHAT, url

pytestmark = pytest.mark.e2e


# A value asking for something of each field of the official client's chat schema the kit does not
# serve yet: each is a 400 naming the field (handlers/generation/fields.py), never free text.
NOT_SERVED_YET = {
    "functions": [{"name": "f", "parameters": {"type": "object"}}],
    "function_call": {"name": "f"},
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "high",
    "verbosity": "low",
    "web_search_options": {},
    "moderation": {"model": "omni-moderation-latest"},
    "store": True,
    "service_tier": "flex",
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "celsius": {"type": "boolean"}},
            "required": ["city", "celsius"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now"}}
# And of every other field: served (parallel_tool_calls asks for nothing without tools).
SERVED = {
    "tools": [WEATHER],
    "tool_choice": "required",
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "logit_bias": {"5": -100},
    "max_completion_tokens": 2,
    "n": 2,
    "logprobs": True,
    "top_logprobs": 2,
    "response_format": {"type": "json_object"},
    "metadata": {"run": "e2e"},
    "parallel_tool_calls": False,
    "prompt_cache_key": "e2e",
    "prompt_cache_options": {},
    "prompt_cache_retention": "in_memory",
    "safety_identifier": "e2e",
    "seed": 3,
    "stop": ["\n\n"],
    "stream_options": None,
    "temperature": 0.5,
    "top_p": 0.9,
    "user": "e2e",
}
ALONG = {"top_logprobs": {"logprobs": True}, "tool_choice": {"tools": [WEATHER]}}  # what a field needs beside it
# What the kit's engine serves and OpenVINO GenAI's pipeline does not (openvino_engine.py).
UNSERVED_ON_OPENVINO = {
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
}


def test_every_field_of_openais_chat_schema_is_served_or_refused_by_name(server, references):
    """The official client sends each field of its chat schema, one at a time, at a value that asks
    for something: what is served answers (a repetition penalty and a logit bias as transformers'
    generate does), the rest is a 400 naming the field; the worker serves on."""
    from openai import BadRequestError, NotFoundError, OpenAI
    from openai.types.chat import completion_create_params

    schema = set(completion_create_params.CompletionCreateParamsBase.__annotations__)
    assert schema - {"model", "messages", "max_tokens"} == set(NOT_SERVED_YET) | set(SERVED)
    client = OpenAI(base_url=server.api.openai_url("/v1"), api_key="unused")  # the one base URL
    openvino = server.config.variant.name == "openvino"
    refused = set(NOT_SERVED_YET) | (UNSERVED_ON_OPENVINO if openvino else set())
    for name, value in {**NOT_SERVED_YET, **SERVED}.items():
        ask = {"model": QWEN, "messages": CHAT, "max_tokens": 2, name: value, **ALONG.get(name, {})}
        if name in refused:
            named = "|".join([name, *ALONG.get(name, {})])  # the first the server met
            with pytest.raises(BadRequestError, match=f"({named}).* is not served"):
                client.chat.completions.create(**ask)
        else:
            assert client.chat.completions.create(**ask).choices[0].finish_reason in ("length", "stop", "tool_calls"), (
                name
            )
    at_its_path = OpenAI(base_url=url(server, QWEN, "v1"), api_key="unused")  # a model's own path checks it too
    with pytest.raises(NotFoundError, match="model 'elsewhere' is not served at this path"):
        at_its_path.chat.completions.create(model="elsewhere", messages=CHAT)
    if openvino:
        return
    reference = references[QWEN]
    plain = reference.chat(16)
    banned = reference.tokens(reference.chat_ids(), 1)[0]  # the greedy answer's first token
    for extra, options in [
        ({"repetition_penalty": 1.5}, {"repetition_penalty": 1.5}),
        ({"logit_bias": {str(banned): -100}}, {"sequence_bias": {(banned,): -100.0}}),
    ]:
        text, count = reference.chat(16, **options)
        assert (text, count) != plain, f"{extra} does not change transformers' answer: nothing to test"
        answer = client.chat.completions.create(
            model=QWEN, messages=CHAT, max_tokens=16, temperature=0, extra_body=extra
        )
        assert (answer.choices[0].message.content, answer.usage.completion_tokens) == (text, count), extra
    # Log-probabilities: transformers' log-softmax of its float32 logits, within 2e-3.
    tokens, scores = reference.scores(reference.chat_ids(), 8)
    answer = client.chat.completions.create(
        model=QWEN,
        messages=CHAT,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},  # all 8, as transformers' without an end
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == len(tokens) == answer.usage.completion_tokens
    for entry, token, score in zip(content, tokens, scores, strict=True):
        assert entry.token == reference.tokenizer.decode([token]) and abs(entry.logprob - float(score[token])) < 2e-3
        top = torch.topk(score, 3).values.tolist()
        assert max(abs(t.logprob - v) for t, v in zip(entry.top_logprobs, top, strict=True)) < 2e-3


TRIAGE = {
    "type": "object",
    "properties": {
        "mood": {"enum": ["happy", "sad", "neutral"]},
        "urgent": {"type": "boolean"},
        "escalate": {"type": "boolean"},
    },
    "required": ["mood", "urgent", "escalate"],
    "additionalProperties": False,
}


def test_a_strict_json_schema_is_answered_valid_whole_and_streamed(server):
    """The official client asks a random model for a strict schema of enums and booleans: every
    answer parses and validates and ends by itself (stop), whole and streamed."""
    import jsonschema
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=server.api.openai_url("/v1"), api_key="unused")  # the one base URL
    response_format = {"type": "json_schema", "json_schema": {"name": "triage", "schema": TRIAGE, "strict": True}}
    ask = {"model": QWEN, "messages": CHAT, "max_tokens": 64, "temperature": 1.0, "response_format": response_format}
    for seed in range(4):
        answer = client.chat.completions.create(**ask, seed=seed).choices[0]
        assert answer.finish_reason == "stop", answer.message.content
        jsonschema.validate(json.loads(answer.message.content), TRIAGE)
    streamed = client.chat.completions.create(**ask, seed=9, stream=True)
    chunks = [c for c in streamed if c.choices]
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in chunks)), TRIAGE)
    assert chunks[-1].choices[0].finish_reason == "stop"
    # llguidance names what it cannot compile; the pipeline's grammar (schema_ebnf.py) the keyword.
    unservable = "pattern is not served" if server.config.variant.name == "openvino" else "look-around"
    with pytest.raises(BadRequestError, match=unservable):
        bad = {"type": "string", "pattern": "(?<=a)b"}
        client.chat.completions.create(
            **{**ask, "response_format": {**response_format, "json_schema": {"name": "x", "schema": bad}}}
        )


def test_forced_tool_calls_validate_whole_and_streamed_and_the_tools_answer_is_answered(server, references):
    """The official client offers a random model with a Hermes-style template two functions: a named
    or required tool_choice gets a call whose arguments validate against the function's parameters,
    ending for tool_calls, whole and streamed; the call and the tool's answer sent back are rendered
    by the model's template as transformers renders them (the greedy answer equal to its)."""
    import jsonschema
    from openai import OpenAI

    client = OpenAI(base_url=server.api.openai_url("/v1"), api_key="unused")  # the one base URL
    ask = {"model": QWEN, "messages": CHAT, "max_tokens": 64, "temperature": 1.0, "tools": [WEATHER, CLOCK]}
    named = {"type": "function", "function": {"name": "get_weather"}}
    calls = []
    for seed, choice in enumerate([named, named, "required", "required"]):
        answer = client.chat.completions.create(**ask, tool_choice=choice, seed=seed).choices[0]
        assert answer.finish_reason == "tool_calls" and answer.message.content is None, answer.message
        (call,) = answer.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        if call.function.name == "get_weather":
            jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        else:
            assert (call.function.name, json.loads(call.function.arguments)) == ("get_time", {})
        assert choice == "required" or call.function.name == "get_weather"
        calls.append(call)
    streamed = [c for c in client.chat.completions.create(**ask, tool_choice=named, seed=7, stream=True) if c.choices]
    deltas = [d for c in streamed for d in c.choices[0].delta.tool_calls or ()]
    assert {d.index for d in deltas} == {0} and deltas[0].function.name == "get_weather"
    jsonschema.validate(
        json.loads("".join(d.function.arguments or "" for d in deltas)), WEATHER["function"]["parameters"]
    )
    assert streamed[-1].choices[0].finish_reason == "tool_calls"
    # The call and the tool's answer go back: greedy, the answer transformers gives the same turns.
    call = calls[0]
    sent = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": call.function.arguments},
    }
    turns = [
        *CHAT,
        {"role": "assistant", "content": None, "tool_calls": [sent]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees"},
    ]
    rendered = [
        *CHAT,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {**sent, "function": {**sent["function"], "arguments": json.loads(call.function.arguments)}}
            ],
        },
        turns[-1],
    ]
    reference = references[QWEN]
    text, count = reference.text(reference.chat_ids(rendered, [WEATHER, CLOCK]), 16)
    answer = client.chat.completions.create(
        model=QWEN, messages=turns, tools=[WEATHER, CLOCK], max_tokens=16, temperature=0
    )
    assert (answer.choices[0].message.content or "", answer.usage.completion_tokens) == (text, count)
