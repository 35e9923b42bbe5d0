"""Every field a request body may hold, and what the kit does with it: none is dropped silently.

    check(Api.CHAT, body, unserved=frozenset())   # InvalidInput naming the first field not served

A client that asks for JSON matching a schema or for a tool call and gets free text with status
200 has a wrong answer it cannot see: a field the kit does not serve is a 400 naming it. Each
field is one of:
- read: the parser (api.py, sampling.py) reads it and the answer follows it;
- idle: taken only at the values that ask for nothing (`response_format: {"type": "text"}`,
  `tools: []`, `echo: false`), else refused with what is not served;
- label: names the caller or the request (`user`, `metadata`); the answer is the same without it.
A field the table does not know is refused too, naming the fields the endpoint takes: a
misspelt `max_token` would otherwise be a default the client did not ask for. A backend may
not serve some read fields (`unserved`, e.g. OpenVINO GenAI's pipeline has no logit bias): those
are refused on it unless they ask for nothing (`read`'s values).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from handlers.payload import InvalidInput


class Api(enum.StrEnum):
    """A request's url_path: which API it speaks."""

    KIT = ""
    COMPLETIONS = "v1/completions"
    CHAT = "v1/chat/completions"
    MODELS = "v1/models"  # a GET: no body, no fields


class Use(enum.Enum):
    READ = "read"
    IDLE = "idle"
    LABEL = "label"


@dataclasses.dataclass(frozen=True)
class Field:
    use: Use
    idle: tuple[Any, ...] = ()  # besides null: the values that ask for nothing
    missing: str = ""  # idle: what asking for more would need, said in the refusal


def read(*nothing: Any) -> Field:
    """`nothing`: the values that ask for nothing, taken where a backend does not serve the field."""
    return Field(Use.READ, nothing)


def label() -> Field:
    return Field(Use.LABEL)


def idle(missing: str, *values: Any) -> Field:
    return Field(Use.IDLE, values, missing)


# What the kit's own API and OpenAI's share: the sampling and the ends of an answer.
SAMPLING = {
    "max_new_tokens": read(),  # the kit's name for max_tokens
    "stop": read(),
    "seed": read(),
    "temperature": read(),
    "top_p": read(),
    "top_k": read(),  # vLLM's and llama.cpp's
    "presence_penalty": read(0),
    "frequency_penalty": read(0),
    "repetition_penalty": read(1),  # transformers', vLLM's and llama.cpp's
    "logit_bias": read({}),
    "ignore_eos": read(),  # vLLM's and llama.cpp's: all max_tokens, for a benchmark
    "stream": read(),
}
OLD_FUNCTIONS = "send tools and tool_choice (functions and function_call are their deprecated forms)"
OPENAI = {
    **SAMPLING,
    "model": read(),
    "max_tokens": read(),
    "stream_options": read(),
    "n": read(1),
    "user": label(),
    "metadata": label(),
    "safety_identifier": label(),
    "prompt_cache_key": label(),  # prefixes are cached whatever the key (prefix_caching)
    "service_tier": idle("one tier is served", "auto", "default"),
    "store": idle("answers are not stored", False),
}
FIELDS: dict[Api, dict[str, Field]] = {
    Api.KIT: {**SAMPLING, "prompt": read(), "text": read()},
    Api.COMPLETIONS: {
        **OPENAI,
        "prompt": read(),
        "logprobs": read(),
        "echo": idle("the prompt is not echoed", False),
        "best_of": idle("choices are not drawn and ranked by likelihood (n asks for several)", 1),
        "suffix": idle("a suffix (fill in the middle) is not served"),
    },
    Api.CHAT: {
        **OPENAI,
        "messages": read(),
        "max_completion_tokens": read(),
        "logprobs": read(False),
        "top_logprobs": read(0),
        "response_format": read({"type": "text"}),
        "tools": read([]),
        "tool_choice": read("none", "auto"),  # required and a named function need the grammar
        "parallel_tool_calls": read(True, False),
        "functions": idle(OLD_FUNCTIONS, []),
        "function_call": idle(OLD_FUNCTIONS, "none", "auto"),
        "prompt_cache_options": label(),
        "prompt_cache_retention": label(),  # cached prefixes live as long as the worker's cache keeps them
        "moderation": idle("moderation is not served"),
        "modalities": idle("text is the only modality served", ["text"]),
        "audio": idle("text is the only modality served"),
        "prediction": idle("predicted outputs are not served"),
        "reasoning_effort": idle("the model's template decides how it reasons"),
        "verbosity": idle("the model's template decides how long it answers"),
        "web_search_options": idle("web search is not served"),
    },
}


def check(api: Api, body: Mapping[str, Any], unserved: frozenset[str] = frozenset(), backend: str = "") -> None:
    """Every field of `body` is one `api` serves, at a value it serves (on `backend`), or InvalidInput
    names it."""
    fields = FIELDS[api]
    for name, value in body.items():
        field = fields.get(name)
        if field is None:
            raise InvalidInput(f"unknown field {name!r}; this endpoint takes {', '.join(sorted(fields))}")
        if value is None or field.use is Use.LABEL:
            continue
        if field.use is Use.IDLE and value not in field.idle:
            raise InvalidInput(f"{name}={value!r} is not served: {field.missing}")
        if field.use is Use.READ and name in unserved and value not in field.idle:
            raise InvalidInput(f"{name} is not served by the {backend} backend; the kit's own backends serve it")
