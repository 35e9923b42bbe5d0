"""Tool calling: OpenAI's `tools` rendered by the model's chat template, its answer's calls found in its text.

    syntax = detect(tokenizer.chat_template, settings.tool_format)   # None: the model cannot be given tools
    tools = Tools.parse(body, syntax)                                 # None: no tools asked for (or tool_choice none)
    prompt_ids = apply_template(messages, tools.definitions, tools.prefix)
    stream = CallStream(tools)                                        # one per choice
    content, calls = stream.feed(delta); ...; content, calls = stream.close()

A model family writes its calls its own way: Hermes and Qwen `<tool_call>{"name": ..., "arguments":
...}</tool_call>`, Mistral `[TOOL_CALLS][{...}, ...]`, Llama 3 a bare `{"name": ..., "parameters": ...}`.
The way is recognised from the chat template (the markers it writes for an assistant's calls), or
named in the model's settings (`tool_format`). `tool_choice: required` or a named function is
enforced, not hoped for: the answer opens with the family's call marker (put after the prompt) and
the rest follows a grammar (grammar.py) whose JSON is a call of one of the functions, its arguments
valid against the function's parameters. With `auto` the model decides; text before a marker is
content, streamed as it comes; text that may begin a marker is held until it is known not to.
`tool_choice: none` answers as if no tools were given: the template is not shown them.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from handlers.payload import InvalidInput

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's function names
MAX_TOOLS = 128  # OpenAI's limit
# OpenAI's reading of a function that names no parameters: it takes none.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


class Syntax(enum.StrEnum):
    """How a model family writes its tool calls (the model's settings: tool_format)."""

    HERMES = "hermes"  # Hermes, Qwen 2 and 3: <tool_call>{"name", "arguments"}</tool_call>, one block per call
    MISTRAL = "mistral"  # [TOOL_CALLS][{"name", "arguments"}, ...]
    LLAMA3_JSON = "llama3_json"  # Llama 3.1-3.3: the whole answer {"name", "parameters"}, calls split by ";"


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's clients read it
    id: str = dataclasses.field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _call(value: Any, key: str) -> ToolCall | None:
    """A decoded call object -> a ToolCall, or None when it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(key, value.get("arguments", value.get("parameters", {})))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _decoded(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _held(text: str, marker: str) -> int:
    """How much of `text` is surely not `marker`'s beginning: all but a tail that may start it."""
    found = text.find(marker)
    if found >= 0:
        return found
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return len(text) - size
    return len(text)


@dataclasses.dataclass(frozen=True)
class Parsed:
    content: str  # the text before the calls
    calls: tuple[ToolCall, ...]


class Format(abc.ABC):
    syntax: Syntax
    prefix: str  # what a forced answer opens with: put after the prompt, the grammar writes the rest
    key: str  # the arguments' key in a call object
    tells: tuple[str, ...]  # what a chat template that writes this family's calls holds

    @abc.abstractmethod
    def releasable(self, text: str) -> int:
        """How many characters of an answer so far are content for sure: before any call."""

    @abc.abstractmethod
    def parse(self, text: str, final: bool) -> Parsed | None:
        """The calls complete in `text` (all of them if `final`) and the content before them;
        None if the text holds something that is not a call where a call should be."""

    @abc.abstractmethod
    def forced_schema(self, calls: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
        """The JSON schema of what follows `prefix` in an answer that must call: `calls` are the
        call objects' schemas, one per function it may call."""

    def call_schema(self, name: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"name": {"const": name}, self.key: parameters},
            "required": ["name", self.key],
            "additionalProperties": False,
        }


class Tagged(Format):
    """Each call in its own <tool_call> ... </tool_call> block."""

    syntax, prefix, key, tells = Syntax.HERMES, "<tool_call>\n", "arguments", ("<tool_call>",)
    start, end = "<tool_call>", "</tool_call>"

    def releasable(self, text: str) -> int:
        return _held(text, self.start)

    def parse(self, text: str, final: bool) -> Parsed | None:
        first = text.find(self.start)
        if first < 0:
            return Parsed(text, ())
        calls = []
        for block in text[first:].split(self.start)[1:]:
            body, ended, _ = block.partition(self.end)
            if not ended and not final:
                break
            call = _call(_decoded(body), self.key)
            if call is None:
                return None
            calls.append(call)
        return Parsed(text[:first], tuple(calls))

    def forced_schema(self, calls: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
        return {"anyOf": calls}  # one block: the grammar ends the answer after it


class Listed(Format):
    """[TOOL_CALLS] then every call in one JSON array."""

    syntax, prefix, key, tells = Syntax.MISTRAL, "[TOOL_CALLS]", "arguments", ("[TOOL_CALLS]",)

    def releasable(self, text: str) -> int:
        return _held(text, self.prefix)

    def parse(self, text: str, final: bool) -> Parsed | None:
        first = text.find(self.prefix)
        if first < 0:
            return Parsed(text, ())
        if not final:
            return Parsed(text[:first], ())
        listed = _decoded(text[first + len(self.prefix) :])
        if not isinstance(listed, list) or not listed:
            return None
        calls = [_call(value, self.key) for value in listed]
        return None if None in calls else Parsed(text[:first], tuple(calls))

    def forced_schema(self, calls: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
        return {"type": "array", "items": {"anyOf": calls}, "minItems": 1, **({} if parallel else {"maxItems": 1})}


class Bare(Format):
    """The whole answer is the calls' JSON (after <|python_tag|>, which decoding may drop)."""

    syntax, prefix, key, tells = Syntax.LLAMA3_JSON, "", "parameters", ("<|python_tag|>",)
    tag = "<|python_tag|>"

    def releasable(self, text: str) -> int:
        head = text.lstrip()
        return 0 if not head or head.startswith("{") or self.tag.startswith(head[: len(self.tag)]) else len(text)

    def parse(self, text: str, final: bool) -> Parsed | None:
        head = text.lstrip().removeprefix(self.tag).lstrip()
        if not head.startswith("{"):
            return Parsed(text, ())
        if not final:
            return Parsed("", ())
        calls = [_call(_decoded(part), self.key) for part in head.split(";") if part.strip()]
        return None if not calls or None in calls else Parsed("", tuple(calls))

    def forced_schema(self, calls: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
        return {"anyOf": calls}


FORMATS: dict[Syntax, Format] = {f.syntax: f for f in (Tagged(), Listed(), Bare())}


def detect(template: str | None, named: Syntax | None = None) -> Format | None:
    """The model's tool-call format: the one its settings name, else the one its chat template writes."""
    if named is not None:
        return FORMATS[named]
    if not template or "tools" not in template:
        return None
    return next((f for f in FORMATS.values() if any(tell in template for tell in f.tells)), None)


class Choice(enum.StrEnum):
    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"
    NAMED = "named"  # {"type": "function", "function": {"name": ...}}


@dataclasses.dataclass(frozen=True)
class Tools:
    """A request's tools, checked: what the template is shown and what the answer must do."""

    format: Format
    definitions: tuple[dict[str, Any], ...]  # as the client sent them: the template renders these
    choice: Choice
    named: str = ""  # Choice.NAMED's function
    parallel: bool = True

    @classmethod
    def parse(cls, body: Mapping[str, Any], format: Format | None) -> Tools | None:
        tools = body.get("tools") or []
        choice, named = _choice(body.get("tool_choice"))
        if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
            raise InvalidInput(f"tools must be a list of at most {MAX_TOOLS} functions, got {tools!r}"[:300])
        if not tools:
            if choice in (Choice.REQUIRED, Choice.NAMED):
                raise InvalidInput(f"tool_choice {body['tool_choice']!r} needs tools")
            return None
        names = [_function_name(index, tool) for index, tool in enumerate(tools)]
        if len(set(names)) < len(names):
            raise InvalidInput(f"tools name a function twice: {names}")
        if choice is Choice.NAMED and named not in names:
            raise InvalidInput(f"tool_choice names function {named!r}, which tools do not hold; they hold {names}")
        if choice is Choice.NONE:
            return None
        if format is None:
            raise InvalidInput(
                "this model's chat template writes no tool calls the kit knows: name its format in the model's "
                f"settings (handler: tool_format: one of {', '.join(Syntax)})"
            )
        parallel = body.get("parallel_tool_calls", True)
        if not isinstance(parallel, bool):
            raise InvalidInput(f"parallel_tool_calls must be true or false, got {parallel!r}")
        return cls(format, tuple(tools), choice, named, parallel)

    @property
    def forced(self) -> bool:
        return self.choice in (Choice.REQUIRED, Choice.NAMED)

    @property
    def prefix(self) -> str:
        """What the answer opens with, after the prompt: a forced answer's call marker."""
        return self.format.prefix if self.forced else ""

    def schema(self) -> dict[str, Any]:
        """A forced answer's grammar: a call of a function it may call, arguments valid by its parameters."""
        calls = [
            self.format.call_schema(t["function"]["name"], t["function"].get("parameters") or NO_PARAMETERS)
            for t in self.definitions
            if self.choice is Choice.REQUIRED or t["function"]["name"] == self.named
        ]
        return self.format.forced_schema(calls, self.parallel)


def _choice(value: Any) -> tuple[Choice, str]:
    if value is None:
        return Choice.AUTO, ""
    if isinstance(value, str) and value in (Choice.NONE, Choice.AUTO, Choice.REQUIRED):
        return Choice(value), ""
    if (
        isinstance(value, dict)
        and value.get("type") == "function"
        and isinstance(value.get("function"), dict)
        and isinstance(value["function"].get("name"), str)
    ):
        return Choice.NAMED, value["function"]["name"]
    raise InvalidInput(
        'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}, '
        f"got {value!r}"
    )


def _function_name(index: int, tool: Any) -> str:
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidInput(f'tools[{index}] must be {{"type": "function", "function": {{"name": ..., ...}}}}')
    if not NAME.fullmatch(function["name"]):
        raise InvalidInput(f"tools[{index}].function.name must be 1-64 of a-z A-Z 0-9 _ -, got {function['name']!r}")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidInput(f"tools[{index}].function.parameters must be a JSON schema object")
    return function["name"]


def template_calls(index: int, calls: Any) -> list[dict[str, Any]]:
    """An assistant message's tool_calls as chat templates read them: the arguments an object, not
    the JSON text OpenAI's clients send back (templates write them with tojson)."""
    if not isinstance(calls, list):
        raise InvalidInput(f"messages[{index}].tool_calls must be a list")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidInput(f'messages[{index}].tool_calls: each needs "function": {{"name", "arguments"}}')
        arguments = function.get("arguments") or "{}"
        if isinstance(arguments, str):
            arguments = _decoded(arguments)
        if not isinstance(arguments, dict):
            raise InvalidInput(f"messages[{index}].tool_calls: arguments of {function['name']!r} are not a JSON object")
        entry = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
        out.append({**entry, "id": call["id"]} if isinstance(call.get("id"), str) else entry)
    return out


class CallStream:
    """One choice's answer read as it comes: the content to pass on, and each call once complete."""

    def __init__(self, tools: Tools):
        self.format = tools.format
        self.text = tools.prefix  # a forced answer's marker is the prompt's: the answer is read with it
        self.released = len(tools.prefix)  # content characters passed on (the marker is none of the answer's)
        self.called = 0  # calls passed on

    def feed(self, delta: str) -> tuple[str, Sequence[ToolCall]]:
        self.text += delta
        return self._read(final=False)

    def close(self) -> tuple[str, Sequence[ToolCall]]:
        return self._read(final=True)

    def _read(self, final: bool) -> tuple[str, Sequence[ToolCall]]:
        parsed = self.format.parse(self.text, final)
        if parsed is None:  # not a call where one should be: the whole answer is content, at its end
            return self._release(len(self.text) if final else self.released), ()
        if final:
            end = len(parsed.content) if parsed.calls else len(self.text)
        else:
            end = min(len(parsed.content), self.format.releasable(self.text))
        calls = parsed.calls[self.called :]
        self.called = len(parsed.calls)
        return self._release(end), calls

    def _release(self, end: int) -> str:
        content = self.text[self.released : max(end, self.released)]
        self.released = max(end, self.released)
        return content
