"""A JSON schema as a grammar of compact JSON in EBNF (xgrammar's dialect), for OpenVINO GenAI.

    compact_ebnf({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
    # root ::= "{" "\\"ok\\"" ":" json_boolean "}"    and the rules of any JSON value (json_boolean ::= ...)

OpenVINO GenAI's pipeline constrains an answer by a JSON schema (`StructuredOutputConfig.json_schema`)
with whitespace free between every token: a random model asked for a 3-field schema of enums and
booleans spent 64 tokens on spaces and newlines in 3 of 4 answers (seeds 0-3, a 4-layer
Qwen2-shaped model), where the kit's engine answers compact JSON (grammar.py). The pipeline also
takes a grammar in EBNF, so the kit writes the schema's compact JSON as one: no whitespace outside
strings, properties in the schema's order.

Served: `type` (one or a list), `enum`, `const`, `anyOf` / `oneOf`, objects' `properties`,
`required` and `additionalProperties` (only the properties named are written), arrays' `items`,
`minItems` and `maxItems` (up to MOST_ITEMS), `$ref` to the root's `$defs` (or `definitions`:
pydantic writes nested models so, and the `openai` client's `parse` sends them; each a rule of its
own, so a model may refer to itself), and the annotations that constrain nothing (`title`,
`description`, ...). Any other keyword (a string's `pattern`, a number's `minimum`, ...) raises
Unservable naming it: a grammar that dropped it would let through answers the schema refuses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "strict", "deprecated"}
)
MOST_ITEMS = 16  # minItems / maxItems are written out item by item
DEFINITIONS = ("$defs", "definitions")  # where a root schema keeps what `$ref` points to

# Any JSON value, compact. A string's characters: anything but a quote, a backslash or a control
# character, or an escape.
ANY = {
    "json_value": "json_object | json_array | json_string | json_number | json_boolean | json_null",
    "json_object": '"{" (json_string ":" json_value ("," json_string ":" json_value)*)? "}"',
    "json_array": '"[" (json_value ("," json_value)*)? "]"',
    "json_string": '"\\"" json_char* "\\""',
    "json_char": '[^"\\\\\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" json_hex json_hex json_hex json_hex)',
    "json_hex": "[0-9a-fA-F]",
    "json_number": '"-"? json_integer ("." [0-9]+)? ([eE] [+-]? [0-9]+)?',
    "json_integer": '"0" | [1-9] [0-9]*',
    "json_boolean": '"true" | "false"',
    "json_null": '"null"',
}
TYPES = {
    "string": "json_string",
    "number": "json_number",
    "integer": '"-"? json_integer',
    "boolean": "json_boolean",
    "null": "json_null",
}
TYPE_KEYWORDS = {  # what each type takes beside `type`
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems"},
}


class Unservable(ValueError):
    """A schema the grammar cannot follow exactly; the message names the construct."""


def compact_ebnf(schema: Any) -> str:
    """`schema` (a JSON schema, parsed) -> an EBNF grammar whose root is its compact JSON."""
    writer = _Writer(schema)
    root = writer.value(schema, "the schema", root=True)
    rules = [f"root ::= {root}", *(f"{name} ::= {rule}" for name, rule in writer.rules.items())]
    if any("json_" in rule for rule in rules):
        rules += [f"{name} ::= {ANY[name]}" for name in ANY]
    return "\n".join(rules)


def literal(value: Any) -> str:
    """A JSON value's compact text as an EBNF string literal."""
    text = json.dumps(value, separators=(",", ":"))
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Writer:
    """One schema's grammar: its root's expression, and a rule for each definition referred to."""

    def __init__(self, schema: Any):
        self.definitions: dict[str, Any] = {}
        if isinstance(schema, Mapping):
            for key in DEFINITIONS:
                self.definitions.update({f"#/{key}/{name}": sub for name, sub in (schema.get(key) or {}).items()})
        self.rules: dict[str, str] = {}  # by rule name, in the order first referred to
        self.names: dict[str, str] = {}  # by `$ref`

    def value(self, schema: Any, where: str, root: bool = False) -> str:
        if schema is True or schema == {}:
            return "json_value"
        if not isinstance(schema, Mapping):
            raise Unservable(f"{where} must be a JSON schema object, got {schema!r}")
        if root:
            schema = {key: sub for key, sub in schema.items() if key not in DEFINITIONS}
        if "$ref" in schema:
            _only(schema, {"$ref"}, where)
            return self.reference(schema["$ref"], where)
        if "const" in schema:
            _only(schema, {"const", "type"}, where)
            return literal(schema["const"])
        if "enum" in schema:
            _only(schema, {"enum", "type"}, where)
            return _either([literal(value) for value in schema["enum"]], where, "enum")
        for key in ("anyOf", "oneOf"):
            if key in schema:
                _only(schema, {key}, where)
                return _either([self.value(each, f"{where}'s {key}") for each in schema[key]], where, key)
        kind = schema.get("type")
        if isinstance(kind, list):
            return _either([self.value({**schema, "type": each}, where) for each in kind], where, "type")
        if kind == "object":
            _only(schema, {"type", *TYPE_KEYWORDS["object"]}, where)
            return self.object(schema, where)
        if kind == "array":
            _only(schema, {"type", *TYPE_KEYWORDS["array"]}, where)
            return self.array(schema, where)
        if kind in TYPES:
            _only(schema, {"type"}, where)
            return TYPES[kind]
        if kind is None:
            _only(schema, set(), where)
            return "json_value"
        raise Unservable(f"{where}'s type {kind!r} is not a JSON schema type")

    def reference(self, ref: Any, where: str) -> str:
        """The rule of the definition `ref` names, written at its first reference."""
        if ref not in self.definitions:
            raise Unservable(f"{where}: $ref {ref!r} is not one of the root's $defs: {sorted(self.definitions)}")
        if ref not in self.names:
            name = f"def{len(self.names)}_{re.sub(r'[^A-Za-z0-9_]', '_', ref.rpartition('/')[2])}"
            self.names[ref] = name
            self.rules[name] = ""  # reserved: a definition may refer to itself
            self.rules[name] = self.value(self.definitions[ref], ref)
        return self.names[ref]

    def object(self, schema: Mapping[str, Any], where: str) -> str:
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        if missing := sorted(required - set(properties)):
            raise Unservable(f"{where} requires {', '.join(missing)} without a schema in its properties")
        if not properties:
            return '"{" "}"' if schema.get("additionalProperties") is False else "json_object"
        members = [
            (f'{literal(name)} ":" {self.value(sub, f"{where}.{name}")}', name in required)
            for name, sub in properties.items()
        ]
        return f'"{{" {_members(members)} "}}"'

    def array(self, schema: Mapping[str, Any], where: str) -> str:
        item = self.value(schema.get("items", True), f"{where}'s items")
        least, most = schema.get("minItems", 0), schema.get("maxItems")
        counts = isinstance(least, int) and (most is None or isinstance(most, int))
        if not counts or not 0 <= least <= MOST_ITEMS or (most is not None and not least <= most <= MOST_ITEMS):
            raise Unservable(
                f"{where}: minItems {least!r}, maxItems {most!r}: counts up to {MOST_ITEMS} (at most {MOST_ITEMS}, "
                "min <= max) are served"
            )
        if most == 0:
            return '"[" "]"'
        rest = [f'("," {item})*'] if most is None else [f'("," {item})?'] * (most - max(least, 1))
        if least:
            return " ".join(['"["', item, *[f'"," {item}'] * (least - 1), *rest, '"]"'])
        return f'"[" ({" ".join([item, *rest])})? "]"'


def _only(schema: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(schema) - allowed - ANNOTATIONS)
    if extra:
        raise Unservable(f"{where}: {', '.join(extra)} is not served by this backend's grammar")


def _either(options: Sequence[str], where: str, key: str) -> str:
    if not options:
        raise Unservable(f"{where}'s {key} is empty: no answer would match")
    return options[0] if len(options) == 1 else "(" + " | ".join(options) + ")"


def _members(members: Sequence[tuple[str, bool]]) -> str:
    """Members in order, each required one present, a comma between two present ones."""

    def after(index: int) -> str:  # members from `index` on, one already written before them
        if index == len(members):
            return ""
        member, required = members[index]
        this = f'"," {member}' if required else f'("," {member})?'
        return f"{this} {after(index + 1)}".strip()

    def first(index: int) -> str:  # members from `index` on, none written yet
        if index == len(members):
            return ""
        member, required = members[index]
        with_it = f"{member} {after(index + 1)}".strip()
        if required:
            return with_it
        without = first(index + 1)
        return f"({with_it} | {without})" if without else f"({with_it})?"

    return first(0)
