"""Progress of long loops (world build steps, generated rows, training steps, timed prompts),
reported to whoever listens, like `logging` for counts: with no listener a report does nothing.

    with listening(lambda done, total, **info: print(done, total, info)):
        for step in range(n):
            report(step + 1, n, loss=0.5)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol


class Sink(Protocol):
    """Receives `(done, total, **info)`; `info` holds a few numbers to show (e.g. loss), or
    `note`: a line to show now (then `done` and `total` mean nothing)."""

    def __call__(self, done: int, total: int, **info: Any) -> None: ...


_sinks: list[Sink] = []


def report(done: int, total: int, **info: Any) -> None:
    """Tell the current listener, if any, that `done` of `total` are done."""
    if _sinks:
        _sinks[-1](done, total, **info)


def current() -> Sink | None:
    """The listener reports go to now (None: nobody listens)."""
    return _sinks[-1] if _sinks and _sinks[-1] is not _ignore else None


@contextlib.contextmanager
def listening(sink: Sink | None) -> Iterator[None]:
    """Send reports to `sink` inside the block (None: keep them from any outer listener)."""
    _sinks.append(sink if sink is not None else _ignore)
    try:
        yield
    finally:
        _sinks.pop()


def _ignore(done: int, total: int, **info: Any) -> None:
    return None
