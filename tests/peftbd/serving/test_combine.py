"""A split replica's Combiner: concurrent batched calls (from several Ingress replicas) run as
one model call of at most `max_batch` items, each caller gets its own replies, in order, timed
from its arrival (its wait behind another call is the replica's time, not transport)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

from peftbd.serving.combine import Combiner
from peftbd.serving.messages import VerifyReply

IN_FLIGHT_S = 0.3


class _Model:
    """Records each call's items (and that no two overlap); each call takes IN_FLIGHT_S, the
    first one only once `release` is set; a reply's token is its item's number, `batch_size` the
    call's items, `handler_ms` 1."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail, self.busy, self.overlapped = fail, threading.Lock(), False
        self.release = threading.Event()

    def run(self, items: Sequence[str]) -> list[str]:
        if not self.busy.acquire(blocking=False):
            self.overlapped = True
            self.busy.acquire()
        try:
            self.calls.append(list(items))
            if len(self.calls) == 1:
                assert self.release.wait(timeout=30), "the test never released the first call"
            time.sleep(IN_FLIGHT_S)
            if self.fail:
                raise RuntimeError("forward failed")
            return [VerifyReply([int(it[1:])], 0, 0, False, None, 0.0, 0.0, False,
                                handler_ms=1.0, batch_size=len(items)) for it in items]
        finally:
            self.busy.release()


async def _first_then_two(combiner: Combiner, model: _Model) -> list[Any]:
    """Call a runs alone; calls b and c arrive while it is in the model and wait IN_FLIGHT_S
    before it is released."""
    first = asyncio.ensure_future(combiner.call("verify", model.run, ["a0", "a1"]))
    while not model.calls:  # a is in the model
        await asyncio.sleep(0.01)
    rest = [asyncio.ensure_future(combiner.call("verify", model.run, ["b2", "b3"])),
            asyncio.ensure_future(combiner.call("verify", model.run, ["c4"]))]
    await asyncio.sleep(IN_FLIGHT_S)
    model.release.set()
    return list(await asyncio.gather(first, *rest, return_exceptions=True))


def test_calls_that_queue_behind_a_batch_run_together_as_the_next() -> None:
    model = _Model()
    replies = asyncio.run(_first_then_two(Combiner(16), model))
    assert model.calls == [["a0", "a1"], ["b2", "b3", "c4"]] and not model.overlapped
    assert [[r.tokens[0] for r in call] for call in replies] == [[0, 1], [2, 3], [4]]
    assert [[r.batch_size for r in call] for call in replies] == [[2, 2], [3, 3], [3]]
    first, *rest = replies
    assert all(r.handler_ms >= 1e3 * IN_FLIGHT_S for r in first)  # its own call
    # its own call after waiting IN_FLIGHT_S behind a's
    assert all(r.handler_ms >= 1e3 * IN_FLIGHT_S * 2 for call in rest for r in call)


def test_a_batch_takes_at_most_max_batch_items() -> None:
    model = _Model()
    replies = asyncio.run(_first_then_two(Combiner(2), model))
    assert model.calls == [["a0", "a1"], ["b2", "b3"], ["c4"]]
    assert [[r.tokens[0] for r in call] for call in replies] == [[0, 1], [2, 3], [4]]


def test_kinds_batch_apart() -> None:
    async def both(combiner: Combiner, model: _Model) -> None:
        await asyncio.gather(combiner.call("prefill", model.run, ["p1"]),
                             combiner.call("verify", model.run, ["v2"]))

    model = _Model()
    model.release.set()
    asyncio.run(both(Combiner(16), model))
    assert sorted(model.calls) == [["p1"], ["v2"]]


def test_an_error_of_a_combined_call_is_every_caller_s() -> None:
    model = _Model(fail=True)
    replies = asyncio.run(_first_then_two(Combiner(16), model))
    assert all(isinstance(r, RuntimeError) for r in replies)
    assert model.calls == [["a0", "a1"], ["b2", "b3", "c4"]]
