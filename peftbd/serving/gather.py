"""Gather concurrent asyncio callers' items into batched calls (the split ingress's step loop).

`Gather(send, max_batch, wait_ms)`: each `await gather.call(item)` joins the pending batch; one
flusher task sends at most `max_batch` items per `send(items) -> results` (results in item
order), waiting up to `wait_ms` for a batch that is not full, and one batch at a time (as Ray
Serve's `@serve.batch` with `max_concurrent_batches=1`): callers that arrive while a batch is in
flight form the next one. An exception of `send` is every caller's of that batch. The flusher
runs in an empty `contextvars` context: calls it makes must not belong to (and be cancelled with)
whichever request happened to start it.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Gather(Generic[T, R]):
    """Batches the items of concurrent `call`s into `send` calls (see module doc)."""

    def __init__(self, send: Callable[[Sequence[T]], Awaitable[Sequence[R]]], max_batch: int,
                 wait_ms: float) -> None:
        if max_batch < 1:
            raise ValueError(f"serving.max_batch={max_batch}; must be >= 1")
        self.send, self.max_batch, self.wait_s = send, max_batch, wait_ms / 1e3
        self._pending: list[tuple[T, asyncio.Future]] = []
        self._full = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def call(self, item: T) -> R:
        """`item`'s result, from the batched `send` it joined."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((item, future))
        if len(self._pending) >= self.max_batch:
            self._full.set()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._flush(), context=contextvars.Context())
        return await future

    async def _flush(self) -> None:
        while self._pending:
            if len(self._pending) < self.max_batch and self.wait_s > 0:
                self._full.clear()
                try:
                    await asyncio.wait_for(self._full.wait(), self.wait_s)
                except asyncio.TimeoutError:
                    pass
            batch = self._pending[: self.max_batch]
            self._pending = self._pending[self.max_batch:]
            live = [(item, f) for item, f in batch if not f.done()]  # a cancelled caller left
            if not live:
                continue
            try:
                results = await self.send([item for item, _ in live])
            except Exception as exc:
                for _, f in live:
                    if not f.done():
                        f.set_exception(exc)
                continue
            for (_, f), result in zip(live, results, strict=True):
                if not f.done():
                    f.set_result(result)
