"""handlers/generation/schema_ebnf.py: a JSON schema written as the EBNF of its compact JSON, and
every keyword it cannot follow refused by name."""

from __future__ import annotations

import pytest

from handlers.generation.schema_ebnf import Unservable, compact_ebnf, literal

TRIAGE = {
    "type": "object",
    "properties": {"mood": {"enum": ["happy", "sad"]}, "urgent": {"type": "boolean", "description": "now?"}},
    "required": ["mood", "urgent"],
    "additionalProperties": False,
}


def root(schema) -> str:
    return compact_ebnf(schema).splitlines()[0]


def test_required_properties_in_the_schemas_order_without_whitespace():
    assert root(TRIAGE) == (
        'root ::= "{" "\\"mood\\"" ":" ("\\"happy\\"" | "\\"sad\\"") "," "\\"urgent\\"" ":" json_boolean "}"'
    )
    # The rules any JSON value needs, once, only when the root uses them.
    assert compact_ebnf(TRIAGE).count("json_boolean ::=") == 1
    assert compact_ebnf({"const": True}) == 'root ::= "true"'


def test_optional_properties_may_be_left_out_with_a_comma_only_between_two_written():
    schema = {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}}, "required": ["b"]}
    assert (
        root(schema)
        == 'root ::= "{" ("\\"a\\"" ":" json_null "," "\\"b\\"" ":" json_null | "\\"b\\"" ":" json_null) "}"'
    )
    none_required = {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}}}
    assert root(none_required) == (
        'root ::= "{" ("\\"a\\"" ":" json_null ("," "\\"b\\"" ":" json_null)? | ("\\"b\\"" ":" json_null)?) "}"'
    )


@pytest.mark.parametrize(
    ("array", "expected"),
    [
        ({}, 'root ::= "[" (json_null ("," json_null)*)? "]"'),
        ({"minItems": 1, "maxItems": 1}, 'root ::= "[" json_null "]"'),
        ({"minItems": 2}, 'root ::= "[" json_null "," json_null ("," json_null)* "]"'),
        ({"maxItems": 2}, 'root ::= "[" (json_null ("," json_null)?)? "]"'),
    ],
)
def test_an_arrays_item_count_is_written_out(array, expected):
    assert root({"type": "array", "items": {"type": "null"}, **array}) == expected


def test_a_literal_is_the_compact_json_text_escaped_for_ebnf():
    assert literal({"k": 'say "hi"\\'}) == '"{\\"k\\":\\"say \\\\\\"hi\\\\\\"\\\\\\\\\\"}"'


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "string", "pattern": "^a"}, "pattern"),
        ({"type": "integer", "minimum": 1}, "minimum"),
        ({"$ref": "#/$defs/x", "type": "object"}, "type is not served"),
        ({"type": "object", "properties": {"n": {"type": "number", "maximum": 3}}}, r"the schema\.n: maximum"),
        ({"type": "array", "maxItems": 100}, "at most 16"),
        ({"enum": []}, "empty"),
        ({"type": "object", "required": ["x"]}, "requires x"),
        ({"type": "decimal"}, "not a JSON schema type"),
    ],
)
def test_what_the_grammar_cannot_follow_is_refused_by_name(schema, named):
    with pytest.raises(Unservable, match=named):
        compact_ebnf(schema)


def test_a_literal_with_two_spaces_keeps_them_inside_an_array():
    assert root({"type": "array", "items": {"const": "a  b"}, "minItems": 1}) == (
        'root ::= "[" "\\"a  b\\"" ("," "\\"a  b\\"")* "]"'
    )


def test_refs_to_the_roots_defs_are_rules_a_definition_may_refer_to_itself():
    # pydantic's shape for nested models, as the `openai` client's `parse` sends it.
    schema = {
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]},
                },
                "required": ["name", "next"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"head": {"$ref": "#/$defs/Node"}},
        "required": ["head"],
        "additionalProperties": False,
    }
    lines = compact_ebnf(schema).splitlines()
    assert lines[:2] == [
        'root ::= "{" "\\"head\\"" ":" def0_Node "}"',
        'def0_Node ::= "{" "\\"name\\"" ":" json_string "," "\\"next\\"" ":" (def0_Node | json_null) "}"',
    ]
    with pytest.raises(Unservable, match=r"\$ref '#/\$defs/Leaf' is not one of the root's \$defs: \['#/\$defs/Node'\]"):
        compact_ebnf({**schema, "properties": {"head": {"$ref": "#/$defs/Leaf"}}})
