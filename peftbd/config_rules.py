"""The rules a config value must follow, written in its field's annotation: a number's `Range`,
a string's `Form`, a list's `DISTINCT`; and the annotated types the config sections use
(`peftbd.config_sections`). `peftbd.config` checks them once a config is complete."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated


@dataclass(frozen=True)
class Range:
    """Inclusive bounds of a number (None: unbounded)."""

    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class Form:
    """A string's form: a regex it must match whole, and the form in words for the error."""

    pattern: str
    words: str


DISTINCT = "distinct"
"""The rule of a list that must hold at least one entry, none twice."""

PositiveInt = Annotated[int, Range(1)]
NonNegativeInt = Annotated[int, Range(0)]
NonNegativeFloat = Annotated[float, Range(0)]
Fraction = Annotated[float, Range(0, 1)]
Device = Annotated[str, Form(r"auto|cpu|cuda(:\d+)?", "auto, cpu, cuda or cuda:N")]
ArmTokens = Annotated[str, Form(r"[a-z][a-z0-9_]*=\d+(\.\d+)?",
                                "arm=tokens_per_round, e.g. peftbd=2.881")]
MethodTokens = Annotated[str, Form(r"[a-z][a-z0-9-]*=\d+(\.\d+)?",
                                   "method=tokens_per_round, e.g. peftbd=2.881")]
