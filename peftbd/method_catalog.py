"""Which drafting methods are registered, as the config and the stage layout read them, apart
from their code: `peftbd.methods.registry.register` adds each `Method` here, and `entries` brings
in the built-in ones first (by name, as a plugin is imported, so nothing here depends on them).

The config builds each method's section from its `config` class and `defaults`; the layout builds
the main job's stages from its `stages`; a name it went by before (`Former`) is refused with a
one-line "renamed to"."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from peftbd.stage import StageSpec

BUILTINS = "peftbd.methods"
"""The package whose import registers the built-in methods (in the report's order)."""


@dataclass(frozen=True)
class Former:
    """Names a method went by before one name (its id) derived them all: each is refused with a
    "renamed to" error."""

    section: str = ""
    serving: str = ""
    dir_arg: str = ""


class Entry(Protocol):
    """What the config and the layout read of a registered method (`peftbd.methods.Method`)."""

    @property
    def id(self) -> str: ...
    @property
    def config(self) -> type: ...
    @property
    def defaults(self) -> Mapping[str, Any]: ...
    @property
    def stages(self) -> tuple[StageSpec, ...]: ...
    @property
    def cost_reads(self) -> tuple[str, ...] | None: ...
    @property
    def former(self) -> Former: ...
    @property
    def arms(self) -> Callable[..., Any]: ...
    @property
    def dir_arg(self) -> str: ...


_ENTRIES: dict[str, Any] = {}


def entries() -> tuple[Entry, ...]:
    """Every registered method, the built-in ones first, in registration order."""
    importlib.import_module(BUILTINS)
    return tuple(_ENTRIES.values())


def rename_hint(name: str) -> str:
    """" ('<name>' was renamed to '<new>')" when a method went by `name` before, else ""."""
    new = renamed(name)
    return f" ({name!r} was renamed to {new!r})" if new is not None else ""


def renamed(name: str) -> str | None:
    """What a method that went by `name` before (as its section, serving name or Serve argument)
    is called now, in that name's form; None: no method did."""
    for m in entries():
        if name in (m.former.section, m.former.serving):
            return m.id
        if name == m.former.dir_arg:
            return m.dir_arg
    return None
