"""The three ways to ask a generative model: a body checked into a Request (answers.py: its answer).

    POST /predictions/<model>                         the kit's: a text, or {"prompt": ..., params}
    POST /predictions/<model>/1.0/v1/completions      OpenAI's completions
    POST /predictions/<model>/1.0/v1/chat/completions OpenAI's chat (the model's chat template)

TorchServe hands the path after the version to the handler as the `url_path` header. Parameters
everywhere: max_new_tokens (OpenAI: max_tokens, max_completion_tokens), stop, temperature,
top_p, top_k, seed, logit_bias, the penalties, stream, and ignore_eos (vLLM's and llama.cpp's:
all max_new_tokens, for a benchmark); chat's tools (tools.py); every other field is refused or
taken by fields.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from handlers.generation import fields
from handlers.generation.fields import Api
from handlers.generation.grammar import Constraint, Grammars
from handlers.generation.logprobs import MAX_TOP
from handlers.generation.sampling import SEED_LIMIT, Sampling, integer
from handlers.generation.sequences import Generation
from handlers.generation.tools import Format, Tools, template_calls
from handlers.payload import InvalidInput, NotFound, TooLong

MAX_STOPS = 8
MAX_CHOICES = 16  # n: each choice a sequence of its own, in the same slots as everyone's


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the model and its worker allow a request (handlers/generation/settings.py)."""

    context: int
    max_new_tokens: int
    sampling: Sampling  # the model's defaults (generation_config.json)
    vocabulary: int = 2**31 - 1  # token ids below it (logit_bias)
    model: str = ""  # the served model's name: what an OpenAI body's `model` must say
    backend: str = ""
    unserved: frozenset[str] = frozenset()  # fields the backend does not serve (fields.check)
    tools: Format | None = None  # how the model writes tool calls (tools.py); None: it is given none


@dataclasses.dataclass(frozen=True)
class Request:
    api: Api
    generation: Generation
    stream: bool
    include_usage: bool = False  # OpenAI's stream_options.include_usage
    n: int = 1  # choices, each a sequence of its own
    tools: Tools | None = None  # the functions the answer may call, and whether it must

    def generations(self) -> list[Generation]:
        """A generation per choice: a seeded request's choice i draws with seed + i, so that the
        same seed gives the same choices and no two choices the same draws."""
        seed = self.generation.sampling.seed
        if seed is None:
            return [self.generation] * self.n
        return [
            dataclasses.replace(
                self.generation,
                sampling=dataclasses.replace(self.generation.sampling, seed=(seed + i) % (SEED_LIMIT + 1)),
            )
            for i in range(self.n)
        ]


Tokenize = Callable[[str], list[int]]
# (messages, the tools to show the model or None, text the answer opens with) -> the prompt's ids
ApplyTemplate = Callable[[list[dict[str, Any]], Sequence[dict[str, Any]] | None, str], list[int]]


def _stops(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > MAX_STOPS:
        raise InvalidInput(f"stop must be a string or a list of at most {MAX_STOPS} strings, got {stop!r}")
    return tuple(s for s in stops if s)


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"{name} must be true or false, got {value!r}")
    return value


def _logprobs(api: Api, body: Mapping[str, Any]) -> int | None:
    """Alternatives per token to return with each token's log-probability; None: no log-probabilities.
    Chat: `logprobs: true` and `top_logprobs: N`; completions: `logprobs: N`."""
    if api is Api.COMPLETIONS:
        return integer(body, "logprobs", None, 0, MAX_TOP)
    if api is Api.CHAT and _flag(body, "logprobs"):
        return integer(body, "top_logprobs", 0, 0, MAX_TOP)
    if body.get("top_logprobs"):
        raise InvalidInput("top_logprobs needs logprobs: true")
    return None


def _constraint(body: Mapping[str, Any], grammars: Grammars | None, tools: Tools | None) -> Constraint | None:
    if grammars is None:  # (fields.check refused response_format and a forced tool_choice where unserved)
        return None
    answer = grammars.parse(body.get("response_format"))
    call = grammars.constraint(json.dumps(tools.schema()), "tool_choice") if tools and tools.forced else None
    if answer is not None and call is not None:
        raise InvalidInput(
            "response_format cannot go with tool_choice required or a named function: the answer is the call"
        )
    constraint = answer or call
    if constraint is not None and body.get("ignore_eos"):
        raise InvalidInput("ignore_eos cannot go with response_format or a forced tool_choice: the grammar ends it")
    return constraint


def _check_model(body: Mapping[str, Any], limits: Limits) -> None:
    model = body.get("model")
    if model is not None and limits.model and model != limits.model:
        raise NotFound(f"model {model!r} is not served at this path; it serves {limits.model!r}")


def _max_new_tokens(body: Mapping[str, Any], limits: Limits, names: tuple[str, ...]) -> int:
    for name in names:
        if body.get(name) is not None:
            return integer(body, name, None, 1, limits.context)
    return limits.max_new_tokens


def _checked_prompt(ids: list[int], limits: Limits) -> tuple[int, ...]:
    if not ids:
        raise InvalidInput("prompt is empty")
    if len(ids) >= limits.context:
        raise TooLong(
            f"prompt is {len(ids)} tokens; this model's context is {limits.context} tokens, the answer "
            "included: shorten the prompt"
        )
    return tuple(ids)


def _prompt_text(body: Mapping[str, Any], names: tuple[str, ...]) -> str:
    for name in names:
        if name in body:
            value = body[name]
            if isinstance(value, list) and len(value) == 1:  # OpenAI's list of one prompt
                value = value[0]
            if not isinstance(value, str):
                raise InvalidInput(f"{name} must be a string, got {type(value).__name__}")
            if not value.strip():
                raise InvalidInput("prompt is empty")
            return value
    raise InvalidInput(f'JSON body needs a string field "{names[0]}", got keys {sorted(body)}')


def _content(index: int, content: Any) -> str:
    if isinstance(content, list):  # OpenAI's content parts: the text ones, joined
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise InvalidInput(f"messages[{index}].content: only text parts are served")
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise InvalidInput(f"messages[{index}].content must be a string")
    return content


def _message(index: int, message: Any) -> dict[str, Any]:
    """One message as the chat template reads it: role and content, an assistant's tool calls, the
    id of the call a tool's message answers."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise InvalidInput(f'messages[{index}] must be an object with a string "role"')
    calls = message.get("tool_calls")
    if calls and message["role"] != "assistant":
        raise InvalidInput(f"messages[{index}]: only an assistant's message holds tool_calls")
    content = message.get("content")
    out: dict[str, Any] = {
        "role": message["role"],
        "content": "" if content is None and calls else _content(index, content),
    }
    if calls:
        out["tool_calls"] = template_calls(index, calls)
    for name in ("tool_call_id", "name"):
        if isinstance(message.get(name), str):
            out[name] = message[name]
    return out


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidInput('chat needs "messages": a non-empty list of {"role": ..., "content": ...}')
    return [_message(index, message) for index, message in enumerate(messages)]


def parse(
    api: Api,
    body: Any,
    limits: Limits,
    tokenize: Tokenize,
    apply_template: ApplyTemplate | None,
    grammars: Grammars | None = None,
) -> Request:
    """A request body (already JSON-decoded, or text for the kit's API) -> a checked Request."""
    if isinstance(body, str) and api is Api.KIT:
        if not body.strip():
            raise InvalidInput("prompt is empty")
        body = {"prompt": body}
    if not isinstance(body, dict):
        raise InvalidInput(f"body must be a JSON object, got a JSON {type(body).__name__}")
    fields.check(api, body, limits.unserved, limits.backend)
    _check_model(body, limits)
    tools = Tools.parse(body, limits.tools) if api is Api.CHAT else None
    if api is Api.CHAT:
        if apply_template is None:
            raise InvalidInput(
                "this model has no chat template (tokenizer_config.json chat_template); use v1/completions"
            )
        ids = apply_template(_messages(body), list(tools.definitions) if tools else None, tools.prefix if tools else "")
    else:
        ids = tokenize(_prompt_text(body, ("prompt", "text") if api is Api.KIT else ("prompt",)))
    names = ("max_new_tokens",) if api is Api.KIT else ("max_completion_tokens", "max_tokens", "max_new_tokens")
    generation = Generation(
        prompt=_checked_prompt(ids, limits),
        max_new_tokens=_max_new_tokens(body, limits, names),
        sampling=Sampling.parse(body, limits.sampling, limits.vocabulary),
        stop=_stops(body),
        ignore_eos=_flag(body, "ignore_eos"),
        logprobs=_logprobs(api, body),
        constraint=_constraint(body, grammars, tools),
    )
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidInput(f"stream_options must be an object, got {options!r}")
    return Request(
        api,
        generation,
        _flag(body, "stream"),
        bool(options.get("include_usage", False)),
        integer(body, "n", 1, 1, MAX_CHOICES),
        tools,
    )
