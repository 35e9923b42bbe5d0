"""handlers/generation/fields.py: every field of OpenAI's request bodies is read, idle or a label;
no other is taken."""

from __future__ import annotations

import pytest
from openai.types import completion_create_params as completions
from openai.types.chat import completion_create_params as chat

from handlers.generation.fields import FIELDS, Api, Use, check
from handlers.payload import InvalidInput

# The official client's request schema (its TypedDicts), the stream flag beside it.
SCHEMA = {
    Api.CHAT: set(chat.CompletionCreateParamsBase.__annotations__) | {"stream"},
    Api.COMPLETIONS: set(completions.CompletionCreateParamsBase.__annotations__) | {"stream"},
}


@pytest.mark.parametrize("api", sorted(SCHEMA))
def test_every_field_of_openais_schema_is_in_the_table(api):
    assert SCHEMA[api] - set(FIELDS[api]) == set()


@pytest.mark.parametrize(
    ("api", "body", "message"),
    [
        (Api.CHAT, {"functions": [{"name": "f"}]}, "functions=.* is not served: send tools and tool_choice"),
        (Api.CHAT, {"store": True}, "store=True is not served: answers are not stored"),
        (Api.CHAT, {"audio": {"voice": "x"}}, "audio=.* is not served: text is the only modality"),
        (Api.CHAT, {"max_token": 5}, "unknown field 'max_token'; this endpoint takes audio, "),
        (Api.COMPLETIONS, {"echo": True}, "echo=True is not served"),
        (Api.COMPLETIONS, {"suffix": "}"}, "suffix='}' is not served"),
        (Api.KIT, {"max_tokens": 5}, "unknown field 'max_tokens'; this endpoint takes "),
    ],
)
def test_a_field_asking_for_what_is_not_served_is_refused_by_name(api, body, message):
    with pytest.raises(InvalidInput, match=message):
        check(api, body)


def test_values_that_ask_for_nothing_and_labels_are_taken():
    check(
        Api.CHAT,
        {
            "n": 1,
            "logprobs": False,
            "top_logprobs": None,
            "response_format": {"type": "text"},
            "tools": [],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "user": "u-1",
            "metadata": {"a": "b"},
            "service_tier": "auto",
            "store": False,
        },
    )
    check(Api.COMPLETIONS, {"n": 1, "echo": False, "best_of": 1, "logprobs": None, "suffix": None})


def test_a_backend_refuses_what_it_does_not_serve_unless_it_asks_for_nothing():
    unserved = frozenset({"logit_bias", "repetition_penalty", "logprobs", "response_format"})
    with pytest.raises(InvalidInput, match="logit_bias is not served by the openvino backend"):
        check(Api.CHAT, {"logit_bias": {"5": 1}}, unserved, "openvino")
    with pytest.raises(InvalidInput, match="logprobs is not served by the openvino backend"):
        check(Api.COMPLETIONS, {"logprobs": 0}, unserved, "openvino")
    with pytest.raises(InvalidInput, match="response_format is not served by the openvino backend"):
        check(Api.CHAT, {"response_format": {"type": "json_object"}}, unserved, "openvino")
    taken = {"logit_bias": {}, "repetition_penalty": 1, "logprobs": False, "response_format": {"type": "text"}}
    check(Api.CHAT, taken, unserved, "openvino")


def test_every_idle_field_says_what_asking_for_more_would_need():
    for fields in FIELDS.values():
        for name, field in fields.items():
            assert field.use in Use and (field.use is not Use.IDLE or field.missing), name


def test_best_of_is_refused_pointing_at_n():
    """n choices are served; best_of asks for more drawn and the likeliest kept, which is not."""
    with pytest.raises(InvalidInput, match=r"best_of=3 is not served: .*ranked by likelihood \(n asks for several\)"):
        check(Api.COMPLETIONS, {"best_of": 3, "n": 1})
