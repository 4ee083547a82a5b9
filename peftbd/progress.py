"""Progress of long loops (world build steps, generated rows, training steps, timed prompts),
reported to whoever listens, like `logging` for counts: with no listener a report does nothing.

    with listening(lambda done, total, **info: print(done, total, info)):
        for step in range(n):
            report(step + 1, n, loss=0.5)
"""

from __future__ import annotations

import contextlib
import threading
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


class Tally:
    """`total` items finishing on any thread: `tick` reports one more done, `note` a line."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        self._lock = threading.Lock()
        self._sink = current()  # the caller's listener: worker threads have none of their own

    def tick(self, **info: Any) -> None:
        with self._lock:
            self.done += 1
            if self._sink:
                self._sink(self.done, self.total, **info)

    def note(self, line: str) -> None:
        if self._sink:
            self._sink(self.done, self.total, note=line)


def _ignore(done: int, total: int, **info: Any) -> None:
    return None
