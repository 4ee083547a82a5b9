"""A discrete-event virtual clock: processes are generators that yield what they wait for, a
device's time (`Hold`, first come first served), or a `Signal` (with a timeout); no thread, no
wall time. Devices keep the intervals they were busy, so a window's busy fraction is read off."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Generator
from dataclasses import dataclass, field


@dataclass
class Device:
    """A simulated device: busy until `free_at` (ms); `busy` lists its (start, end) intervals."""

    name: str
    free_at: float = 0.0
    busy: list[tuple[float, float]] = field(default_factory=list)

    def busy_fraction(self, start: float, end: float) -> float:
        """The share of [start, end) it was busy."""
        if end <= start:
            return 0.0
        held = sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.busy)
        return held / (end - start)


@dataclass(frozen=True)
class Hold:
    """Wait `ms` on `device` once it is free (None: a plain delay, no device)."""

    device: Device | None
    ms: float


@dataclass(eq=False)
class Signal:
    """Something processes wait for (`Wait`); `fire` wakes every waiter now (`fired`: it has
    fired at least once, for a one-off event that may end before anyone waits)."""

    clock: VirtualClock
    waiters: list[tuple[Process, int]] = field(default_factory=list)
    fired: bool = False

    def fire(self) -> None:
        self.fired = True
        waiters, self.waiters = self.waiters, []
        for process, wake in waiters:
            self.clock.wake(process, wake, self.clock.now)


@dataclass(frozen=True)
class Wait:
    """Wait for `signal`, at most `timeout_ms` (None: no limit)."""

    signal: Signal
    timeout_ms: float | None = None


Command = Hold | Wait
Process = Generator[Command, None, None]


class VirtualClock:
    """Runs processes in virtual time (ms) until none has anything left to wait for."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Process, int]] = []
        self._order = itertools.count()
        self._wakes: dict[int, int] = {}  # id(process): the wake-up that counts

    def spawn(self, process: Process) -> None:
        """Start `process` now."""
        self.wake(process, self._arm(process), self.now)

    def signal(self) -> Signal:
        return Signal(self)

    def wake(self, process: Process, wake: int, at: float) -> None:
        heapq.heappush(self._queue, (at, next(self._order), process, wake))

    def _arm(self, process: Process) -> int:
        wake = next(self._order)
        self._wakes[id(process)] = wake
        return wake

    def run(self) -> float:
        """Run until nothing is scheduled; the time then."""
        while self._queue:
            at, _, process, wake = heapq.heappop(self._queue)
            if self._wakes.get(id(process)) != wake:
                continue  # a timeout beaten by its signal, or the other way round
            self.now = at
            try:
                command = next(process)
            except StopIteration:
                del self._wakes[id(process)]
                continue
            wake = self._arm(process)
            if isinstance(command, Hold):
                start = self.now if command.device is None else max(self.now, command.device.free_at)
                end = start + command.ms
                if command.device is not None:
                    command.device.free_at = end
                    command.device.busy.append((start, end))
                self.wake(process, wake, end)
            else:
                command.signal.waiters.append((process, wake))
                if command.timeout_ms is not None:
                    self.wake(process, wake, self.now + command.timeout_ms)
        return self.now
