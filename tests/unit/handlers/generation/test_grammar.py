"""handlers/generation/grammar.py: response_format as a grammar every token follows, on the tiny
test models' own tokenizers; a schema llguidance cannot serve is refused naming the construct."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from handlers.generation.grammar import Grammars
from handlers.payload import InvalidInput
from tests.hf_models import gpt2_lm, qwen2_lm

SCHEMA = {
    "type": "object",
    "properties": {"mood": {"enum": ["happy", "sad", "neutral"]}, "urgent": {"type": "boolean"}},
    "required": ["mood", "urgent"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "triage", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module", params=["qwen2", "gpt2"])
def grammars(request, tmp_path_factory):
    directory = {"qwen2": qwen2_lm, "gpt2": gpt2_lm}[request.param](tmp_path_factory.mktemp(request.param))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    config = AutoConfig.from_pretrained(directory)
    eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    return Grammars(tokenizer, config.vocab_size, set(eos)), tokenizer, min(eos)


def answer(grammars, response_format, seed: int, limit: int = 64) -> tuple[str, bool]:
    """Random logits through the constraint's mask: the text, and whether it ended at its end token."""
    grammars_, tokenizer, eos = grammars
    matcher = grammars_.parse(response_format).matcher()
    generator, tokens = torch.Generator().manual_seed(seed), []
    for _ in range(limit):
        token = int(matcher.masked(torch.randn(grammars_.vocabulary, generator=generator)).argmax())
        matcher.accept(token)
        if token == eos:
            return tokenizer.decode(tokens), True
        tokens.append(token)
    return tokenizer.decode(tokens), False


@pytest.mark.parametrize("seed", range(4))
def test_a_schema_of_enums_and_booleans_is_answered_valid_and_ended_by_any_logits(grammars, seed):
    text, ended = answer(grammars, FORMAT, seed)
    assert ended, text
    jsonschema.validate(json.loads(text), SCHEMA)
    assert " " not in text  # compact: no whitespace to spend tokens on


def test_json_object_is_any_object_and_text_is_free(grammars):
    text, ended = answer(grammars, {"type": "json_object"}, seed=0, limit=200)
    assert not ended or isinstance(json.loads(text), dict)
    assert text.startswith("{")
    assert grammars[0].parse({"type": "text"}) is None and grammars[0].parse(None) is None


def test_a_schema_is_compiled_once(grammars):
    grammars_ = grammars[0]
    grammars_.parse(FORMAT)
    before = grammars_.compiled.cache_info().hits
    grammars_.parse(FORMAT)
    assert grammars_.compiled.cache_info().hits == before + 1


@pytest.mark.parametrize(
    ("response_format", "message"),
    [
        ({"type": "yaml"}, "response_format must be {'type': one of text, json_object, json_schema}"),
        ({"type": "json_schema"}, 'response_format json_schema needs "json_schema"'),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?<=a)b"}}},
            "(?s)cannot be served: regex parse error.*look-around",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}},
            "cannot be served: .*/nowhere",
        ),
    ],
)
def test_a_format_that_cannot_be_served_is_refused_naming_the_construct(grammars, response_format, message):
    with pytest.raises(InvalidInput, match=message):
        grammars[0].parse(response_format)


def test_masking_compiles_nothing(grammars):
    """llguidance's own apply_token_bitmask_inplace is torch.compiled at its first call: a request
    would wait for the compiler. The kit's mask is eager."""
    from handlers.optimize import graphs_compiled

    before = graphs_compiled()
    answer(grammars, FORMAT, seed=1)
    assert graphs_compiled() == before
