"""The split ingress's gathering of concurrent calls into batched ones (asyncio only)."""

from __future__ import annotations

import asyncio
import time

import pytest

from peftbd.serving.gather import Gather


def _recorder(batches: list):
    async def send(items):
        batches.append(list(items))
        await asyncio.sleep(0.01)
        if "boom" in items:
            raise RuntimeError("replica bug")
        return [f"r{item}" for item in items]

    return send


def test_concurrent_callers_share_batches_capped_at_max_batch():
    batches: list = []
    gather = Gather(_recorder(batches), max_batch=4, wait_ms=50, expected=lambda: 1)

    async def run():
        return await asyncio.gather(*(gather.call(i) for i in range(10)))

    assert asyncio.run(run()) == [f"r{i}" for i in range(10)]  # each its own result
    assert [len(b) for b in batches] == [4, 4, 2]


def test_a_lone_caller_does_not_wait_when_nobody_is_expected():
    gather = Gather(_recorder([]), max_batch=16, wait_ms=1000)
    start = time.perf_counter()
    assert asyncio.run(gather.call(1)) == "r1"
    assert time.perf_counter() - start < 0.5


def test_an_error_is_every_caller_of_its_batch():
    gather = Gather(_recorder([]), max_batch=2, wait_ms=50, expected=lambda: 1)

    async def run():
        return await asyncio.gather(gather.call("boom"), gather.call("x"), gather.call("y"),
                                    return_exceptions=True)

    first, second, third = asyncio.run(run())
    assert isinstance(first, RuntimeError) and isinstance(second, RuntimeError)
    assert third == "ry"  # the next batch is not affected
    with pytest.raises(ValueError, match="serving.max_batch"):
        Gather(_recorder([]), max_batch=0, wait_ms=1)


def test_callers_out_of_phase_merge_into_one_batch():
    """B arrives while A's first batch is in flight; once A is answered it calls again before
    the next batch is cut, so from then on A and B share every batch."""
    batches: list = []
    gather = Gather(_recorder(batches), max_batch=16, wait_ms=0)

    async def caller(name: str, delay: float):
        await asyncio.sleep(delay)
        for i in range(4):
            await gather.call(f"{name}{i}")

    async def run():
        await asyncio.gather(caller("a", 0), caller("b", 0.002))

    asyncio.run(run())
    assert [len(b) for b in batches] == [1, 2, 2, 2, 1]  # not [1, 1, 1, ...] alternating


def test_a_batch_waits_for_its_round_still_in_an_earlier_call(monkeypatch):
    """`behind`: a verify waits (past `wait_ms`) for a request still proposing, up to
    ROUND_WAIT_S; then it goes without it."""
    import peftbd.serving.gather as gather_module

    batches: list = []
    proposing = {"n": 1}
    gather = Gather(_recorder(batches), max_batch=16, wait_ms=0, behind=lambda: proposing["n"])

    async def late():
        await asyncio.sleep(0.03)  # its propose takes 30 ms
        proposing["n"] = 0
        return await gather.call("late")

    async def run():
        return await asyncio.gather(gather.call("early"), late())

    assert asyncio.run(run()) == ["rearly", "rlate"] and [len(b) for b in batches] == [2]
    monkeypatch.setattr(gather_module, "ROUND_WAIT_S", 0.05)
    proposing["n"], batches[:] = 1, []  # never comes: the batch leaves after the cap
    start = time.perf_counter()
    asyncio.run(Gather(_recorder(batches), 16, 0, behind=lambda: 1).call("x"))
    assert 0.04 < time.perf_counter() - start < 0.5 and batches == [["x"]]


def test_the_round_wait_grows_with_the_calls_own_duration(monkeypatch):
    """At a large model's shape a call takes longer than ROUND_WAIT_S: a verify still waits for
    its round's request proposing, up to ROUND_WAIT_CALLS x the last call."""
    import peftbd.serving.gather as gather_module

    monkeypatch.setattr(gather_module, "ROUND_WAIT_S", 0.02)
    batches: list = []
    proposing = {"n": 0}

    async def slow(items):
        await asyncio.sleep(0.05)  # a 50 ms call
        batches.append(list(items))
        return [f"r{i}" for i in items]

    gather = Gather(slow, max_batch=16, wait_ms=0, behind=lambda: proposing["n"])

    async def late():
        await asyncio.sleep(0.1)  # its propose takes 100 ms: past ROUND_WAIT_S, within 3 calls
        proposing["n"] = 0
        return await gather.call("late")

    async def run():
        await gather.call("first")  # times one call
        proposing["n"] = 1
        return await asyncio.gather(gather.call("early"), late())

    assert asyncio.run(run()) == ["rearly", "rlate"] and [len(b) for b in batches] == [1, 2]
