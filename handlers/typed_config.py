"""Configuration parsed once into typed data: a mapping (YAML) -> a frozen dataclass, every value
coerced to its field's type, unknown keys and wrong values refused with a message that names them.

    settings = parse_settings(TextSettings, {"max_length": 64})    # handlers/settings.py
    config = parse_settings(ServeConfig, preset)                   # kit/serve_config.py

One parser for the whole kit. It lives in handlers/ because archives carry handlers/ and a
worker parses its model-config.yaml with it; it imports nothing else of the kit.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Mapping
from typing import Any, TypeVar


class SettingsError(ValueError):
    """A configuration value is wrong; the message names it and says how to fix it."""


S = TypeVar("S")


def _coerce(name: str, kind: Any, value: Any) -> Any:
    args = typing.get_args(kind)
    if type(None) in args:  # `X | None`: null stays null, anything else must be an X
        return None if value is None else _coerce(name, next(a for a in args if a is not type(None)), value)
    if typing.get_origin(kind) is tuple:
        if not isinstance(value, (list, tuple)):
            raise SettingsError(f"{name} must be a list, got {value!r}")
        args = typing.get_args(kind)
        kinds = [args[0]] * len(value) if args[1:] == (Ellipsis,) else list(args)
        if len(kinds) != len(value):
            raise SettingsError(f"{name} needs {len(kinds)} values, got {value!r}")
        return tuple(_coerce(f"{name}[{i}]", k, item) for i, (k, item) in enumerate(zip(kinds, value, strict=True)))
    if typing.get_origin(kind) is dict:
        key_kind, value_kind = typing.get_args(kind)
        if not isinstance(value, Mapping):
            raise SettingsError(f"{name} must be a mapping (key: value), got {value!r}")
        return {
            _coerce(f"{name} key", key_kind, key): _coerce(f"{name}.{key}", value_kind, item)
            for key, item in value.items()
        }
    # A section of its own. (Anything else is left to the class holding it: a Variant is named.)
    if dataclasses.is_dataclass(kind) and isinstance(value, Mapping):
        try:
            return parse_settings(kind, value)
        except SettingsError as error:
            raise SettingsError(f"{name}: {error}") from None
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            choices = ", ".join(member.value for member in kind)
            raise SettingsError(f"{name} {value!r} is unknown; choose one of: {choices}") from None
    # YAML already gives bool/int/str; reject look-alikes such as "yes" or 1 for a bool.
    if kind is bool and not isinstance(value, bool):
        raise SettingsError(f"{name} must be true or false, got {value!r}")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise SettingsError(f"{name} must be an integer, got {value!r}")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingsError(f"{name} must be a number, got {value!r}")
        return float(value)
    if kind is str and not isinstance(value, str):
        raise SettingsError(f"{name} must be a string, got {value!r}")
    return value


def parse_settings(cls: type[S], raw: Mapping[str, Any] | None) -> S:
    """Build `cls` from a mapping, rejecting unknown keys and coercing each value once."""
    raw = dict(raw or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise SettingsError(f"unknown setting(s) {unknown} for {cls.__name__}; valid keys: {sorted(fields)}")
    required = [name for name, f in fields.items() if f.default is f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in raw]
    if missing:
        raise SettingsError(f"missing setting(s) {missing} for {cls.__name__}; it needs {required}")
    hints = typing.get_type_hints(cls)
    values = {name: _coerce(name, hints[name], value) for name, value in raw.items()}
    return cls(**values)
