"""A split replica's Combiner: concurrent batched calls (from several Ingress replicas) run as
one model call of at most `max_batch` items, each caller gets its own replies, in order."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

from peftbd.serving.combine import Combiner

IN_FLIGHT_S = 0.3


class _Model:
    """Records each call's items (and that no two overlap); replies name their item."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail, self.busy, self.overlapped = fail, threading.Lock(), False

    def run(self, items: Sequence[str]) -> list[str]:
        if not self.busy.acquire(blocking=False):
            self.overlapped = True
            self.busy.acquire()
        try:
            self.calls.append(list(items))
            time.sleep(IN_FLIGHT_S)
            if self.fail:
                raise RuntimeError("forward failed")
            return [f"reply-{it}" for it in items]
        finally:
            self.busy.release()


async def _first_then_two(combiner: Combiner, model: _Model) -> list[object]:
    """Call a runs alone; calls b and c arrive while it is in flight."""
    first = asyncio.ensure_future(combiner.call("verify", model.run, ["a1", "a2"]))
    await asyncio.sleep(IN_FLIGHT_S / 3)
    rest = [combiner.call("verify", model.run, ["b1", "b2"]),
            combiner.call("verify", model.run, ["c1"])]
    return list(await asyncio.gather(first, *rest, return_exceptions=True))


def test_calls_that_queue_behind_a_batch_run_together_as_the_next() -> None:
    model = _Model()
    replies = asyncio.run(_first_then_two(Combiner(16), model))
    assert model.calls == [["a1", "a2"], ["b1", "b2", "c1"]] and not model.overlapped
    assert replies == [["reply-a1", "reply-a2"], ["reply-b1", "reply-b2"], ["reply-c1"]]


def test_a_batch_takes_at_most_max_batch_items() -> None:
    model = _Model()
    replies = asyncio.run(_first_then_two(Combiner(2), model))
    assert model.calls == [["a1", "a2"], ["b1", "b2"], ["c1"]]
    assert replies == [["reply-a1", "reply-a2"], ["reply-b1", "reply-b2"], ["reply-c1"]]


def test_kinds_batch_apart() -> None:
    async def both(combiner: Combiner, model: _Model) -> None:
        await asyncio.gather(combiner.call("prefill", model.run, ["p1"]),
                             combiner.call("verify", model.run, ["v1"]))

    model = _Model()
    asyncio.run(both(Combiner(16), model))
    assert sorted(model.calls) == [["p1"], ["v1"]]


def test_an_error_of_a_combined_call_is_every_caller_s() -> None:
    model = _Model(fail=True)
    replies = asyncio.run(_first_then_two(Combiner(16), model))
    assert all(isinstance(r, RuntimeError) for r in replies)
    assert model.calls == [["a1", "a2"], ["b1", "b2", "c1"]]
