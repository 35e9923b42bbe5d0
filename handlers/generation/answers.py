"""A request's answer in its API's shapes: the kit's, OpenAI's completions and chat, whole or as
server-sent events (respond.py sends them; api.py parses what they answer).

    answer = ANSWERS[request.api](request_id, model, request)
    answer.first(); answer.chunk(delta, index, logprobs); answer.calls(calls, index, first)
    answer.finished(reason, index, called); answer.closing(usage)      # streamed
    answer.whole([Said(text, reason, logprobs, calls), ...], usage)    # whole

A streamed OpenAI answer is server-sent events as OpenAI's clients parse them
("data: {chunk}\\n\\n" ... "data: [DONE]\\n\\n"); the kit's streams the bare text.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from handlers import openai_shapes
from handlers.generation.api import Request
from handlers.generation.fields import Api
from handlers.generation.logprobs import TokenLogprob
from handlers.generation.sequences import Finish, Usage
from handlers.generation.tools import ToolCall
from handlers.payload import error_body as kit_error_body

SSE = "text/event-stream"
TEXT = "text/plain; charset=utf-8"
JSON = "application/json"
DONE = b"data: [DONE]\n\n"


TOOL_CALLS = "tool_calls"  # OpenAI's finish_reason of an answer that ends in calls


def finish_reason(reason: Finish, called: bool = False) -> str:
    # OpenAI knows stop and length; a cancelled answer reaches no client, "stop" keeps its shape.
    if reason is Finish.LENGTH:
        return Finish.LENGTH.value
    return TOOL_CALLS if called else Finish.STOP.value


def encode(payload: object) -> bytes:
    """JSON as every answer and event carries it: compact, UTF-8."""
    return json.dumps(payload, separators=(",", ":")).encode()


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + encode(payload) + b"\n\n"


@dataclasses.dataclass(frozen=True)
class Said:
    """One choice, whole: its text, why it ended, its tokens' log-probabilities (if asked), its calls."""

    text: str
    reason: Finish
    logprobs: Sequence[TokenLogprob] = ()
    calls: Sequence[ToolCall] = ()


@dataclasses.dataclass(frozen=True)
class Piece:
    """What a choice's entry of an OpenAI answer says: a streamed delta (`text`), a streamed end
    (`reason`), or the whole choice (`streamed` False)."""

    index: int
    text: str | None
    reason: str | None
    streamed: bool
    logprobs: Sequence[TokenLogprob] = ()
    calls: Sequence[ToolCall] = ()


class Answer(abc.ABC):
    """One request's answer, in its API's shapes: streamed, `first`, then a `chunk` per text delta
    of a choice (with the log-probabilities of the tokens it releases), its `finished` once it
    ends, `closing` after the last; whole, `whole` once."""

    def __init__(self, request_id: str, model: str, request: Request):
        self.id, self.model, self.request = request_id, model, request
        self.created = int(time.time())

    @property
    @abc.abstractmethod
    def stream_type(self) -> str: ...

    def first(self) -> bytes:
        """What a stream opens with (chat's role chunks), or nothing."""
        return b""

    @abc.abstractmethod
    def chunk(self, delta: str, index: int = 0, logprobs: Sequence[TokenLogprob] = ()) -> bytes: ...

    def finished(self, reason: Finish, index: int = 0, called: bool = False) -> bytes:
        """What a stream sends when choice `index` ends (`called`: its answer made tool calls)."""
        return b""

    def calls(self, calls: Sequence[ToolCall], index: int, first: int) -> bytes:
        """A stream's piece for tool calls of choice `index`, numbered from `first` (chat only)."""
        return b""

    def closing(self, usage: Usage) -> bytes:
        """What a stream ends with, after every choice has."""
        return b""

    @abc.abstractmethod
    def whole(self, choices: list[Said], usage: Usage) -> dict[str, Any]: ...


class KitAnswer(Answer):
    stream_type = TEXT

    def chunk(self, delta: str, index: int = 0, logprobs: Sequence[TokenLogprob] = ()) -> bytes:
        return delta.encode()

    def whole(self, choices: list[Said], usage: Usage) -> dict[str, Any]:
        (said,) = choices  # the kit's API takes no n
        return {"text": said.text, "finish_reason": finish_reason(said.reason), "usage": usage.as_dict()}


class OpenAiAnswer(Answer):
    stream_type = SSE
    object_name: str
    chunk_name: str
    id_prefix: str

    def envelope(self, name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": f"{self.id_prefix}-{self.id}",
            "object": name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    @abc.abstractmethod
    def choice(self, piece: Piece) -> dict[str, Any]: ...

    def chunk(self, delta: str, index: int = 0, logprobs: Sequence[TokenLogprob] = ()) -> bytes:
        return event(self.envelope(self.chunk_name, [self.choice(Piece(index, delta, None, True, logprobs))]))

    def finished(self, reason: Finish, index: int = 0, called: bool = False) -> bytes:
        said = self.choice(Piece(index, None, finish_reason(reason, called), True))
        return event(self.envelope(self.chunk_name, [said]))

    def closing(self, usage: Usage) -> bytes:
        if not self.request.include_usage:
            return DONE
        return event({**self.envelope(self.chunk_name, []), "usage": usage.as_dict()}) + DONE

    def whole(self, choices: list[Said], usage: Usage) -> dict[str, Any]:
        answers = [
            self.choice(
                Piece(i, said.text, finish_reason(said.reason, bool(said.calls)), False, said.logprobs, said.calls)
            )
            for i, said in enumerate(choices)
        ]
        return {**self.envelope(self.object_name, answers), "usage": usage.as_dict()}

    @property
    def asks_logprobs(self) -> bool:
        return self.request.generation.logprobs is not None


class CompletionAnswer(OpenAiAnswer):
    object_name, chunk_name, id_prefix = "text_completion", "text_completion", "cmpl"

    def __init__(self, request_id: str, model: str, request: Request):
        super().__init__(request_id, model, request)
        self.offsets: dict[int, int] = {}  # by choice: where its next token's text begins in its answer

    def choice(self, piece: Piece) -> dict[str, Any]:
        logprobs = self.logprobs(piece.index, piece.logprobs, piece.streamed) if self.asks_logprobs else None
        return {"index": piece.index, "text": piece.text or "", "logprobs": logprobs, "finish_reason": piece.reason}

    def logprobs(self, index: int, entries: Sequence[TokenLogprob], streamed: bool) -> dict[str, Any]:
        """The completions API's shape; text_offset counts from the answer's start (no echo)."""
        offset = self.offsets.get(index, 0) if streamed else 0
        offsets = []
        for entry in entries:
            offsets.append(offset)
            offset += len(entry.token)
        if streamed:
            self.offsets[index] = offset
        return {
            "tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [dict(e.top) for e in entries],
            "text_offset": offsets,
        }


def chat_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


class ChatAnswer(OpenAiAnswer):
    object_name, chunk_name, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def first(self) -> bytes:
        return b"".join(
            event(
                self.envelope(
                    self.chunk_name,
                    [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                )
            )
            for i in range(self.request.n)
        )

    def choice(self, piece: Piece) -> dict[str, Any]:
        index, text = piece.index, piece.text
        if piece.streamed:
            said = {"index": index, "delta": {} if text is None else {"content": text}}
        elif piece.calls:  # the text around the calls (a newline before a marker) is no answer of its own
            content = text.strip() if text else None
            said = {
                "index": index,
                "message": {
                    "role": "assistant",
                    "content": content or None,
                    "tool_calls": [c.as_dict() for c in piece.calls],
                },
            }
        else:
            said = {"index": index, "message": {"role": "assistant", "content": text}}
        if self.asks_logprobs:
            content = [
                {**chat_entry(e.token, e.logprob), "top_logprobs": [chat_entry(t, v) for t, v in e.top]}
                for e in piece.logprobs
            ]
            said["logprobs"] = {"content": content, "refusal": None}
        return {**said, "finish_reason": piece.reason}

    def calls(self, calls: Sequence[ToolCall], index: int, first: int) -> bytes:
        deltas = [{"index": first + k, **call.as_dict()} for k, call in enumerate(calls)]
        return event(
            self.envelope(self.chunk_name, [{"index": index, "delta": {"tool_calls": deltas}, "finish_reason": None}])
        )


ANSWERS: dict[Api, type[Answer]] = {Api.KIT: KitAnswer, Api.COMPLETIONS: CompletionAnswer, Api.CHAT: ChatAnswer}


def model_list(model: str, context: int) -> dict[str, Any]:
    """OpenAI's /v1/models at this model's path: the model, and its context as vLLM names it."""
    entry = {"id": model, "object": "model", "created": int(time.time()), "owned_by": "kit", "max_model_len": context}
    return {"object": "list", "data": [entry]}


def error_body(api: Api, message: str, code: int) -> dict[str, Any]:
    """The kit's error shape, or OpenAI's for its paths (its clients read error.message)."""
    if api is Api.KIT:
        return kit_error_body(message, code)
    return openai_shapes.error_body(message, code)
