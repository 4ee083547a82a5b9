"""The step loop's scheduling decisions, apart from its threads and clock: how requests are dealt
into groups, when an idle group waits for a fuller batch, which method's scheduler a group steps
next, whether a Drafter may draft ahead. The serving replica's threads (`peftbd.serving.batcher.StepLoop`) and the placement
simulator's virtual clock (`peftbd.simulation.placements`) both decide through these."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from peftbd.decoding.scheduler import Engine, Scheduler

T = TypeVar("T")


@dataclass(eq=False)
class Group(Generic[T]):
    """One group of a step loop: its waiting and closing requests and a scheduler per method,
    stepped in turn (requests of different methods never share a forward)."""

    index: int
    waiting: list[T] = field(default_factory=list)
    closing: list[T] = field(default_factory=list)
    schedulers: dict[str, Scheduler[Any]] = field(default_factory=dict)
    turn: int = 0

    @property
    def busy(self) -> bool:
        """A scheduler of the group has requests."""
        return any(s.busy for s in self.schedulers.values())

    @property
    def idle(self) -> bool:
        """Nothing to do: the group blocks until a request is dealt to it."""
        return not self.waiting and not self.busy

    def batching(self, max_batch: int) -> bool:
        """An idle group with requests waiting, fewer than a full batch: it waits (up to
        `serving.batch_wait_ms`) for more before its first step."""
        return bool(self.waiting) and not self.busy and len(self.waiting) < max_batch

    def scheduler(self, method: str, engine: Callable[[], Engine[Any]], max_batch: int) -> Scheduler[Any]:
        """The group's scheduler of `method`, made over `engine()` the first time."""
        if method not in self.schedulers:
            self.schedulers[method] = Scheduler(engine(), max_batch)
        return self.schedulers[method]

    def next_method(self) -> str | None:
        """The next method (round robin) whose scheduler has requests."""
        methods = [m for m, s in self.schedulers.items() if s.busy]
        if not methods:
            return None
        self.turn = (self.turn + 1) % len(methods)
        return methods[self.turn]


def deal(groups: Sequence[Group[T]], dealt: int) -> Group[T]:
    """The group the `dealt`-th request goes to: round robin."""
    return groups[dealt % len(groups)]


def solo(groups: Sequence[Group[T]]) -> bool:
    """At most one group has requests: a split Verifier's Drafter would otherwise idle while it
    verifies, so it may draft ahead (`serving.draft_ahead`)."""
    return sum(bool(g.waiting) or g.busy for g in groups) <= 1
