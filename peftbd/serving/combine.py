"""A split replica's second gathering: concurrent batched calls combined into one model call.

The round driver gathers each of its groups' requests (`peftbd.serving.round_driver`), and calls
of several groups (or several callers) can reach a replica while it is busy: the replica would
run one forward each where one would do.
`Combiner.call(kind, run, items)` puts the call's items in the replica's gather of that kind
(no wait: a lone call runs at once); calls that arrive while a batch of that kind is in flight,
from any caller, run together as the next batch, at most `max_batch` items (Ray Serve's
`@serve.batch` with `max_concurrent_batches=1` and no timeout, kept per replica instance).
`run` is blocking model work, done in a worker thread so the replica's event loop keeps taking
calls. Each reply's `handler_ms` becomes the call's whole time here (its wait behind other calls
included), so the ingress counts only the hops as transport. An exception of `run` is every
caller's of that batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from peftbd.serving.gather import Gather
from peftbd.serving.messages import Reply


class Combiner:
    """One `Gather` per kind of call (propose, prefill, verify), created in the running loop."""

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self._gathers: dict[str, Gather[Any, Any]] = {}

    async def call(self, kind: str, run: Callable[[list[Any]], list[Reply]],
                   items: Sequence[Any]) -> list[Reply]:
        """`run`'s replies to `items`, in order, from the batch (or batches) they joined."""
        start = time.perf_counter()
        gather = self._gathers.get(kind)
        if gather is None:
            async def send(batch: Sequence[Any]) -> list[Reply]:
                return await asyncio.to_thread(run, list(batch))

            gather = self._gathers[kind] = Gather(send, self.max_batch, wait_ms=0.0)
        replies = await asyncio.gather(*(gather.call(it) for it in items))
        here_ms = (time.perf_counter() - start) * 1e3
        return [dataclasses.replace(r, handler_ms=max(r.handler_ms, here_ms)) for r in replies]
