"""An honest clock: on CUDA every reading waits for queued kernels, so times are real."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch


class Clock:
    """Wall clock that synchronizes `device` (CUDA) before each reading."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._sync = device.type == "cuda"

    def now(self) -> float:
        """Seconds (perf_counter) after all work queued on the device has finished."""
        if self._sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


@dataclass
class ForwardLog:
    """Forward calls and their total seconds per mode (`prefill`, `draft`, `verify`, ...).

    `observer`, when set, wraps every forward call (given its mode) inside the timed span: the
    cost profiler counts each forward's FLOPs and bytes with it (an untimed round)."""

    clock: Clock
    calls: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    observer: Callable[[str], contextlib.AbstractContextManager[None]] | None = None

    @contextlib.contextmanager
    def timed(self, mode: str, *shared: ForwardLog) -> Iterator[None]:
        """Time one forward call of `mode`; a batched call also counts, whole, in the logs of
        the other rows it served (`shared`): each of them waited for all of it."""
        start = self.clock.now()
        with self.observer(mode) if self.observer else contextlib.nullcontext():
            yield
        elapsed = self.clock.now() - start
        for log in (self, *shared):
            log.seconds[mode] = log.seconds.get(mode, 0.0) + elapsed
            log.calls[mode] = log.calls.get(mode, 0) + 1
