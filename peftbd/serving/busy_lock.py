"""A replica's model lock that also measures how long it was held: the replica's busy time (its
forwards and the host work between them), from which the placement job computes each replica's
busy fraction of a run's wall time."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


class BusyLock:
    """`with lock:` as a `threading.Lock`; `busy_s` = total seconds it was held."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since = 0.0
        self.busy_s = 0.0

    def __enter__(self) -> BusyLock:
        self._lock.acquire()
        self._since = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.busy_s += time.perf_counter() - self._since
        self._lock.release()

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """Inside `with lock:`, let other threads take it meanwhile (a remote call's wait)."""
        self.__exit__()
        try:
            yield
        finally:
            self.__enter__()
