"""Structured output: OpenAI's `response_format` as a grammar each token of the answer must follow.

    grammars = Grammars(tokenizer, vocabulary, eos)
    constraint = grammars.parse(body["response_format"])   # None for {"type": "text"}; InvalidInput if unservable
    matcher = constraint.matcher()                          # one per sequence
    logits = matcher.masked(logits)                         # every token the grammar forbids at -inf
    matcher.accept(token)

llguidance (requirements/main.txt says why it and not xgrammar) turns a JSON schema into a token
mask per step: microseconds per step against a decode step's tens of milliseconds. Whitespace
is not flexible: the answer is compact JSON, so a model (a random one included) cannot spend its
tokens on spaces and finishes a small schema well inside max_tokens. Once the value is complete
the grammar allows only an end-of-sequence token: the answer ends there (finish_reason stop).
A schema is compiled once and kept (by its text); one llguidance cannot serve is a 400 naming
the construct, as llguidance reports it.

An engine whose steps follow a grammar themselves (OpenVINO GenAI's pipeline) takes the schema's
compact JSON as EBNF instead (schema_ebnf.py): its `dialect`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from handlers.generation.schema_ebnf import Unservable, compact_ebnf
from handlers.payload import InvalidInput

BIT_SHIFTS = torch.arange(32, dtype=torch.int32)  # a mask word's bits, lowest first (llguidance's order)
CACHED_SCHEMAS = 256  # compiled grammars kept, the least recently used dropped first
FORMATS = ("text", "json_object", "json_schema")
ANY_OBJECT = {"type": "object"}  # json_object: a JSON object, whatever its keys


class Dialect(enum.Enum):
    """Who follows the grammar, and so what it is written in."""

    LLGUIDANCE = "llguidance"  # the kit's engine masks each step's logits (Matcher)
    EBNF = "ebnf"  # the engine's own sampler follows it (openvino_engine.py)


@dataclasses.dataclass(frozen=True)
class Constraint:
    """A compiled grammar and the tokenizer it masks: a matcher per sequence."""

    grammar: str  # llguidance's grammar (JSON text), or EBNF text (dialect)
    tokenizer: Any = dataclasses.field(compare=False)  # llguidance.LLTokenizer (None for EBNF)
    dialect: Dialect = Dialect.LLGUIDANCE

    def matcher(self) -> Matcher | None:
        """Where a sequence is in the grammar, for the kit's masks; None where the engine follows it."""
        if self.dialect is not Dialect.LLGUIDANCE:
            return None
        import llguidance

        return Matcher(llguidance.LLMatcher(self.tokenizer, self.grammar), self.tokenizer.vocab_size)


class Matcher:
    """Where one sequence is in its grammar."""

    def __init__(self, matcher, vocabulary: int):
        import llguidance.torch

        self.matcher = matcher
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, vocabulary)

    def masked(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [vocab] -> a copy with every token the grammar forbids next at -inf. The bits are
        unpacked here, not by llguidance's apply_token_bitmask_inplace, which torch.compiles itself
        at its first call: a request would wait for the compiler (and the worker's recompile watch
        would say so)."""
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask(self.matcher, self.bitmask, 0)
        allowed = ((self.bitmask[0, :, None] >> BIT_SHIFTS) & 1).flatten()[: logits.shape[-1]].bool()
        return logits.float().masked_fill(~allowed, -math.inf)

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)


class Grammars:
    """A worker's grammars: its tokenizer made llguidance's once (at the first schema: 0.5 s for a
    vocabulary of 150,000), each schema compiled once."""

    def __init__(self, tokenizer, vocabulary: int, eos: Iterable[int], dialect: Dialect = Dialect.LLGUIDANCE):
        self.hf_tokenizer, self.vocabulary, self.eos, self.dialect = tokenizer, vocabulary, sorted(eos), dialect
        self.lock = threading.Lock()
        self._tokenizer = None

    @property
    def tokenizer(self):
        with self.lock:
            if self._tokenizer is None:
                import llguidance.hf

                # llguidance ends a grammar's answer with one end-of-sequence token: the model's first.
                self._tokenizer = llguidance.hf.from_tokenizer(
                    self.hf_tokenizer, n_vocab=self.vocabulary, eos_token=self.eos[0] if self.eos else None
                )
            return self._tokenizer

    def parse(self, response_format: Any) -> Constraint | None:
        """OpenAI's response_format -> the answer's constraint (None: free text), or InvalidInput."""
        if response_format is None:
            return None
        if not isinstance(response_format, Mapping) or response_format.get("type") not in FORMATS:
            raise InvalidInput(
                f"response_format must be {{'type': one of {', '.join(FORMATS)}}}, got {response_format!r}"
            )
        kind = response_format["type"]
        if kind == "text":
            return None
        if kind == "json_object":
            return self.constraint(json.dumps(ANY_OBJECT))
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
            raise InvalidInput('response_format json_schema needs "json_schema": {"name": ..., "schema": {...}}')
        return self.constraint(json.dumps(spec["schema"]))  # its properties' order is the answer's

    def constraint(self, schema: str, asker: str = "response_format json_schema") -> Constraint:
        """`schema` (JSON text) compiled; `asker`: the field that asked for it, named if it cannot be served."""
        if self.dialect is Dialect.EBNF:
            return Constraint(self.ebnf(schema, asker), None, Dialect.EBNF)
        return Constraint(self.compiled(schema, asker), self.tokenizer)

    @functools.lru_cache(maxsize=CACHED_SCHEMAS)  # noqa: B019 - one Grammars per worker, for its life
    def ebnf(self, schema: str, asker: str) -> str:
        try:
            return compact_ebnf(json.loads(schema))
        except Unservable as error:
            raise InvalidInput(f"{asker} cannot be served: {error}") from None

    @functools.lru_cache(maxsize=CACHED_SCHEMAS)  # noqa: B019 - one Grammars per worker, for its life
    def compiled(self, schema: str, asker: str) -> str:
        import llguidance

        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.loads(schema), defaults={"whitespace_flexible": False}
            )
        except (ValueError, RuntimeError) as error:
            raise InvalidInput(f"{asker} cannot be served: {error}") from None
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if failed:
            raise InvalidInput(f"{asker} cannot be served: {'; '.join(messages)}")
        return grammar
