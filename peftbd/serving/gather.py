"""Gather concurrent asyncio callers' items into batched calls (the split round driver's step
loop).

`Gather(send, max_batch, wait_ms, expected)`: each `await gather.call(item)` joins the pending
batch; one flusher task sends at most `max_batch` items per `send(items) -> results` (results in
item order), one batch at a time (as Ray Serve's `@serve.batch` with `max_concurrent_batches=1`):
callers that arrive while a batch is in flight form the next one. A batch that is not full
waits up to `wait_ms` for more, but only while `expected()` (how many callers are on their way
here: between two calls, heading to this one) is > 0, so a lone request never waits and a batch
whose other members are still in another call does not wait for them. `behind()` counts the
members of the same round still in an earlier call (a split verify: the requests still
proposing); a batch waits for them up to `ROUND_WAIT_S` (or `ROUND_WAIT_CALLS` x its last call,
if longer), which puts requests that drifted out of phase (one proposing while the other
verifies, alternating forever) back in lockstep. Only the
last call of a round may wait for an earlier one, so two gathers never wait for each other.
After each batch the flusher lets the callers it answered resume before it cuts the next one,
so requests in lockstep stay in one batch instead of splitting into two that alternate. An exception of `send` is every caller's of that batch. The flusher
runs in an empty `contextvars` context: calls it makes must not belong to (and be cancelled with)
whichever request happened to start it.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

ROUND_WAIT_S = 1.0
ROUND_WAIT_CALLS = 3.0
"""The longest a batch waits for `behind()` members: ROUND_WAIT_S, or ROUND_WAIT_CALLS times this
gather's last call if that is longer (at a 0.6B model's shape on a CPU a call takes seconds, and
a group that misses its members once would stay out of phase). A healthy call returns far
sooner; one whose replica is being replaced can take minutes, and the others must not wait."""

T = TypeVar("T")
R = TypeVar("R")


class Gather(Generic[T, R]):
    """Batches the items of concurrent `call`s into `send` calls (see module doc)."""

    def __init__(self, send: Callable[[Sequence[T]], Awaitable[Sequence[R]]], max_batch: int,
                 wait_ms: float, expected: Callable[[], int] = lambda: 0,
                 behind: Callable[[], int] = lambda: 0) -> None:
        if max_batch < 1:
            raise ValueError(f"serving.max_batch={max_batch}; must be >= 1")
        self.send, self.max_batch, self.wait_s = send, max_batch, wait_ms / 1e3
        self.expected, self.behind = expected, behind
        self._pending: list[tuple[T, asyncio.Future]] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._sending = False
        self.last_call_s = 0.0  # how long the last `send` took

    @property
    def idle(self) -> bool:
        """No item is waiting here or in a `send` now."""
        return not self._pending and not self._sending

    def poke(self) -> None:
        """Re-check `expected` / `behind` now (a caller's course changed)."""
        self._arrived.set()

    async def call(self, item: T) -> R:
        """`item`'s result, from the batched `send` it joined."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((item, future))
        self._arrived.set()
        if self._task is None or self._task.done():
            # created inside an empty context, the task copies it (3.10 has no `context=`)
            self._task = contextvars.Context().run(loop.create_task, self._flush())
        return await future

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            start = loop.time()
            round_wait = max(ROUND_WAIT_S, ROUND_WAIT_CALLS * self.last_call_s)
            while len(self._pending) < self.max_batch:
                now = loop.time()
                if self.behind() > 0 and now < start + round_wait:
                    left = start + round_wait - now
                elif self.expected() > 0 and now < start + self.wait_s:
                    left = start + self.wait_s - now
                else:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except asyncio.TimeoutError:
                    pass
            batch = self._pending[: self.max_batch]
            self._pending = self._pending[self.max_batch:]
            live = [(item, f) for item, f in batch if not f.done()]  # a cancelled caller left
            if not live:
                continue
            sent, self._sending = loop.time(), True
            try:
                results = await self.send([item for item, _ in live])
                self.last_call_s = loop.time() - sent
            except Exception as exc:
                for _, f in live:
                    if not f.done():
                        f.set_exception(exc)
                continue
            finally:
                self._sending = False
            for (_, f), result in zip(live, results, strict=True):
                if not f.done():
                    f.set_result(result)
            # let the callers just answered resume first: those that call again join the
            # next batch (or say they are heading here) before it is cut
            await asyncio.sleep(0)
