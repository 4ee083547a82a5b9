"""Type-checked building and merging of nested mappings into frozen dataclasses: the config's
loading rules.

`build` makes a dataclass tree from a complete nested mapping (a preset: every field set) and
`merge` applies a partial one (a YAML file, an override) to a tree, both checking every value
against its field's annotation (`Literal` fields accept only their listed values, by type too);
an unknown or missing key or a bad value raises `ConfigError` naming the key, the value and the
allowed form.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from peftbd.errors import UserError


class _Dataclass(Protocol):
    __dataclass_fields__: ClassVar[dict[str, Any]]


T = TypeVar("T", bound=_Dataclass)


class ConfigError(UserError, ValueError):
    """A config key, value or file is not valid; the message names it and the allowed form."""


def build(cls: type[T], tree: dict[str, Any], prefix: str = "") -> T:
    """A dataclass `cls` from `tree` (nested mapping), which sets every field, type-checked."""
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in tree
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"config key '{prefix}{missing[0]}' is missing; a preset sets every key "
                          f"(peftbd/configs/*.yaml)")
    return cls(**_checked(cls, tree, prefix, None))


def merge(obj: T, updates: dict[str, Any], prefix: str) -> T:
    """Return a copy of dataclass `obj` with `updates` (nested mapping) applied and type-checked."""
    return dataclasses.replace(obj, **_checked(type(obj), updates, prefix, obj))


def _checked(cls: type, updates: dict[str, Any], prefix: str, current: Any) -> dict[str, Any]:
    """`updates`' values for fields of `cls`, checked: sections built, or merged into `current`'s."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    changes: dict[str, Any] = {}
    for name, value in updates.items():
        key = f"{prefix}{name}"
        if name not in fields:
            close = difflib.get_close_matches(str(name), fields, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise ConfigError(
                f"unknown config key {key!r}{hint}; keys under "
                f"{prefix.rstrip('.') or 'the top level'}: {', '.join(fields)}"
            )
        section = hints[name]
        if isinstance(section, type) and dataclasses.is_dataclass(section):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"config key {key!r} is a section; set one of its fields instead, "
                    f"e.g. {key}.{dataclasses.fields(section)[0].name}=..."
                )
            changes[name] = build(section, value, f"{key}.") if current is None \
                else merge(getattr(current, name), value, prefix=f"{key}.")
        else:
            changes[name] = _coerce(key, value, hints[name])
    return changes


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is Literal:
        return "one of: " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is tuple:
        item = typing.get_args(tp)[0]
        if typing.get_origin(item) is Literal:
            return f"a list whose items are each {_describe(item)}"
        return f"a list of {_describe(item)}"
    if tp is type(None):
        return "null"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, str(tp)
    )


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the annotation `tp`; allow int -> float and list -> tuple."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(key, value, arg)
            except ConfigError:
                continue
    elif origin is Literal:
        for allowed in typing.get_args(tp):  # by type too: true is not 1, 2.0 is not 2
            if value == allowed and type(value) is type(allowed):
                return value
    elif origin is tuple:
        if isinstance(value, (list, tuple)):
            item_type = typing.get_args(tp)[0]
            return tuple(_coerce(f"{key}[{i}]", v, item_type) for i, v in enumerate(value))
    elif tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    raise ConfigError(
        f"config key {key!r}: value {value!r} is not valid; expected {_describe(tp)}"
    )
