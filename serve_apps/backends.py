"""How the ingress gets a request's steps: streamed from the colocated `Engine`, or from the split
app's round driver (`Rounds`), whose calls to the `Drafter` and `Verifier` handles are wired here
(`split_driver`). Every hop survives a dead replica by resuming elsewhere from the committed tokens
(at most `serving.round_retries` times, then a clear `BackendUnavailable`)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, cast

from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

from peftbd.config import ServingConfig
from peftbd.serving.roles import Role
from peftbd.serving.round_driver import Answer, CallKind, Item, RoundDriver
from peftbd.serving.rounds import RoundEvent
from peftbd.serving.validation import GenerationSpec

log = logging.getLogger("ray.serve")

REPLICA_LOST = (RayActorError,)
"""Errors of a call whose replica died or became unreachable (ActorDiedError, ...Unavailable)."""


class BackendUnavailable(RuntimeError):
    """A request's replica kept dying; the message says which deployment and how often."""


class _Retrying:
    """Retries a remote call after a lost replica; retries wait at most `recovery_timeout_s`."""

    def __init__(self, serving: ServingConfig) -> None:
        self.retries = serving.round_retries
        self.timeout_s = serving.recovery_timeout_s

    def failed(self, what: str, attempt: int, exc: BaseException) -> None:
        if attempt >= self.retries:
            raise BackendUnavailable(
                f"the {what} replica serving this request was lost {attempt + 1} times "
                f"({type(exc).__name__}) and the request could not be completed. Retry it; if "
                f"this persists, check `serve status` (serving.round_retries={self.retries})"
            ) from exc
        log.warning("%s replica lost (%s); resuming the request elsewhere", what, type(exc).__name__)

    async def call(self, what: str, send: Callable[[], Awaitable[Any]]) -> tuple[Any, float]:
        """(result, ingress-side wall ms of the successful attempt)."""
        for attempt in range(self.retries + 1):
            start = time.perf_counter()
            try:
                if attempt == 0:
                    result = await send()
                else:
                    result = await asyncio.wait_for(send(), self.timeout_s)
                return result, (time.perf_counter() - start) * 1e3
            except REPLICA_LOST as exc:
                self.failed(what, attempt, exc)
        raise AssertionError("unreachable")


class _StreamBackend:
    """Streams a request's steps from one replica that runs its whole loop; a lost replica's
    request restarts on another from the tokens already committed."""

    role: Role

    def __init__(self, handle: DeploymentHandle, serving: ServingConfig) -> None:
        self.handle = handle.options(stream=True)
        self.retry = _Retrying(serving)

    def _open(self, spec: GenerationSpec, committed: list[int]) -> AsyncIterator[RoundEvent]:
        raise NotImplementedError

    def _timed(self, event: RoundEvent, wall_ms: float) -> None:
        """Fill in the ingress-side transport of an event `wall_ms` after the previous one."""

    async def rounds(self, spec: GenerationSpec) -> AsyncGenerator[RoundEvent, None]:
        committed = list(spec.prompt_ids)
        for attempt in range(self.retry.retries + 1):
            stream = self._open(spec, committed)
            try:
                last = time.perf_counter()
                async for event in stream:
                    now = time.perf_counter()
                    self._timed(event, (now - last) * 1e3)
                    last = now
                    committed.extend(event.tokens)
                    yield event
                return
            except REPLICA_LOST as exc:
                self.retry.failed(self.role.deployment, attempt, exc)


class ColocatedBackend(_StreamBackend):
    """Streams a request's steps from one `Engine` replica (the whole loop runs there)."""

    role = Role.ENGINE

    def _open(self, spec: GenerationSpec, committed: list[int]) -> AsyncIterator[RoundEvent]:
        # a streaming handle's call: the `RoundEvent`s `Engine.rounds` yields, as objects
        return cast("AsyncIterator[RoundEvent]", self.handle.rounds.remote(
            spec.prompt_ids, spec.max_new_tokens, spec.method, committed, spec.sampling))

    def _timed(self, event: RoundEvent, wall_ms: float) -> None:
        """Transport per step = the wall time between two events minus the step's compute."""
        event.transport_ms = max(wall_ms - event.compute_ms, 0.0)


class SplitBackend(_StreamBackend):
    """Streams a request's steps from the split app's one round driver (`Rounds`, which runs
    every request's rounds over the Drafter and the Verifier: `split_driver`); its events carry
    the driver's transport (its calls' wall time minus the replicas' time)."""

    role = Role.ROUNDS

    def _open(self, spec: GenerationSpec, committed: list[int]) -> AsyncIterator[RoundEvent]:
        return cast("AsyncIterator[RoundEvent]", self.handle.rounds.remote(spec, committed))


class _Shards:
    """A split deployment's handle with its shard keys: a request's batched calls are routed by
    the key of its session id's shard (`serving.drafter_replicas` / `verifier_replicas` shards),
    so they keep reaching the replica that holds its session (Ray's consistent hashing of the
    key), while the requests of one shard share one call."""

    def __init__(self, handle: DeploymentHandle, name: str, shards: int) -> None:
        self.handle, self.name, self.shards = handle, name, shards

    def key(self, session_id: str) -> str:
        return f"{self.name}-{zlib.crc32(session_id.encode()) % self.shards}"

    def to(self, session_id: str) -> DeploymentHandle:
        """The handle routed as `session_id`'s batched calls are."""
        return self.handle.options(session_id=self.key(session_id))


class _SplitCalls:
    """The round driver's calls to the Drafter and the Verifier: a batch becomes one call per
    shard, retried after a lost replica; a release is fire and forget."""

    def __init__(self, drafter: DeploymentHandle, verifier: DeploymentHandle,
                 serving: ServingConfig) -> None:
        self.shards = {Role.DRAFTER: _Shards(drafter, Role.DRAFTER.deployment,
                                             serving.drafter_replicas),
                       Role.VERIFIER: _Shards(verifier, Role.VERIFIER.deployment,
                                              serving.verifier_replicas)}
        self.retry = _Retrying(serving)

    async def send(self, kind: CallKind, items: Sequence[Item]) -> list[Answer]:
        """One call per shard, concurrently; a shard whose replica kept dying fails only its
        own items."""
        target = self.shards[Role.DRAFTER if kind in ("propose", "ahead") else Role.VERIFIER]
        groups: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(target.key(item.session_id), []).append(i)

        async def shard(key: str, idx: list[int]) -> list[Answer]:
            handle, batch = target.handle.options(session_id=key), [items[i] for i in idx]
            replies, wall = await self.retry.call(
                target.name, lambda: getattr(handle, f"{kind}_batch").remote(batch))
            share = max(wall - replies[0].handler_ms, 0.0) / len(idx)
            return [(reply, share) for reply in replies]

        out: dict[int, Answer] = {}  # item index: its reply or its shard's error
        done = await asyncio.gather(*(shard(k, idx) for k, idx in groups.items()),
                                    return_exceptions=True)
        for idx, result in zip(groups.values(), done):
            for n, i in enumerate(idx):
                out[i] = result if isinstance(result, BaseException) else result[n]
        return [out[i] for i in range(len(items))]

    def release(self, role: Role, session_id: str) -> None:
        target = self.shards[role]
        _detached(lambda: target.to(session_id).release.remote(session_id))


def split_driver(drafter: DeploymentHandle, verifier: DeploymentHandle,
                 serving: ServingConfig) -> RoundDriver:
    """The round driver of a split app over its Drafter and Verifier handles
    (`peftbd.serving.round_driver.RoundDriver`, which the `Rounds` deployment runs)."""
    calls = _SplitCalls(drafter, verifier, serving)
    return RoundDriver(calls.send, calls.release, serving)


def _detached(call: Callable[[], Any]) -> None:
    """Make a fire-and-forget remote call outside the current request's context: Serve cancels
    the calls a request makes when its client disconnects, and a release must still arrive then.
    A lost release only leaves an entry for the replica's LRU to evict."""
    contextvars.Context().run(call)
