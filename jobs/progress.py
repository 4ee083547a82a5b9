"""Progress from Ray workers: a tiny actor holds the latest report of a remote loop and a driver
thread hands it to the driver's current listener (`peftbd.progress`), which draws the bar."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import ray

from peftbd import progress

POLL_S = 0.5


@ray.remote(num_cpus=0)
class _Latest:
    """The latest report of each part (e.g. one benchmark worker's share); `get` sums them."""

    def __init__(self) -> None:
        self.parts: dict[int, tuple[int, int]] = {}
        self.info: dict[str, Any] = {}

    def put(self, part: int, done: int, total: int, info: dict[str, Any]) -> None:
        self.parts[part] = (done, total)
        self.info = info

    def get(self) -> tuple[int, int, dict[str, Any]] | None:
        if not self.parts:
            return None
        return sum(d for d, _ in self.parts.values()), sum(t for _, t in self.parts.values()), self.info


class RemoteSink:
    """A picklable `progress.Sink` for Ray workers and tasks; `part(i)` for the i-th of several
    that share one bar."""

    def __init__(self, actor: Any, index: int = 0) -> None:
        self.actor, self.index = actor, index

    def part(self, index: int) -> RemoteSink:
        return RemoteSink(self.actor, index)

    def __call__(self, done: int, total: int, **info: Any) -> None:
        self.actor.put.remote(self.index, done, total, info)


@contextlib.contextmanager
def relay() -> Iterator[RemoteSink | None]:
    """A sink workers can report to, relayed to the driver's listener; None when nobody listens."""
    local = progress.current()
    if local is None:
        yield None
        return
    # @ray.remote made `_Latest` an ActorClass; the type checker keeps a decorated class's type
    actor = _Latest.remote()  # type: ignore[attr-defined]
    stop = threading.Event()

    def poll() -> None:
        while True:
            stopping = stop.wait(POLL_S)
            state = ray.get(actor.get.remote())
            if state is not None:
                local(state[0], state[1], **state[2])
            if stopping:
                return

    thread = threading.Thread(target=poll, name="progress-relay", daemon=True)
    thread.start()
    try:
        yield RemoteSink(actor)
    finally:
        stop.set()
        thread.join(timeout=10)
        ray.kill(actor)
