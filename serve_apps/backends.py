"""How the ingress gets a request's steps: from the colocated `Engine`, or by running the rounds
over the split `Drafter` and `Verifier` handles. Both yield `RoundEvent`s and survive a dead
replica by resuming elsewhere from the committed tokens (at most `serving.round_retries` times,
then a clear `BackendUnavailable`)."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import itertools
import logging
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

from peftbd.config import ServingConfig
from peftbd.serving.gather import Gather
from peftbd.serving.messages import (
    PrefillItem,
    PrefillReply,
    ProposeItem,
    ProposeReply,
    VerifyItem,
    VerifyReply,
)
from peftbd.serving.roles import Role
from peftbd.serving.rounds import RoundEvent, prefill_event, split_round
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


class ColocatedBackend:
    """Streams a request's steps from one `Engine` replica (the whole loop runs there)."""

    def __init__(self, engine: DeploymentHandle, serving: ServingConfig) -> None:
        self.engine = engine.options(stream=True)
        self.retry = _Retrying(serving)

    async def rounds(self, spec: GenerationSpec) -> AsyncGenerator[RoundEvent, None]:
        """Transport per step = the wall time between two events minus the step's compute."""
        committed = list(spec.prompt_ids)
        for attempt in range(self.retry.retries + 1):
            # a streaming handle's call: the `RoundEvent`s `Engine.rounds` yields, as objects
            stream = cast("AsyncIterator[RoundEvent]", self.engine.rounds.remote(
                spec.prompt_ids, spec.max_new_tokens, spec.method, committed, spec.sampling
            ))
            try:
                last = time.perf_counter()
                async for event in stream:
                    now = time.perf_counter()
                    event.transport_ms = max((now - last) * 1e3 - event.compute_ms, 0.0)
                    last = now
                    committed.extend(event.tokens)
                    yield event
                return
            except REPLICA_LOST as exc:
                self.retry.failed(Role.ENGINE.deployment, attempt, exc)


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


Reply = tuple[PrefillReply | ProposeReply | VerifyReply, float]
"""A batched call's reply for one item: (the reply, the item's share of the call's transport
ms, the items the call carried)."""

_R = TypeVar("_R", PrefillReply, ProposeReply, VerifyReply)


class _Course:
    """Where one request of `group` is: heading to a call (`("to", kind, group)`, between two
    calls) or in one (`("in", kind, group)`, pending or sent), counted in `counts`; `changed`
    runs on every move (the gathers re-check whom to wait for: `Gather.expected` / `behind`)."""

    def __init__(self, counts: collections.Counter, changed: Callable[[], None],
                 group: int = 0) -> None:
        self.counts, self.changed, self.group = counts, changed, group
        self.where: tuple[str, str, int] | None = None

    def move(self, where: tuple[str, str] | None) -> None:
        if self.where is not None:
            self.counts[self.where] -= 1
        self.where = None if where is None else (*where, self.group)
        if self.where is not None:
            self.counts[self.where] += 1
        self.changed()


class SplitBackend:
    """Runs the rounds: Drafter.propose_batch then Verifier.verify_batch. Requests are dealt
    round-robin into `serving.split_groups` groups; each group's items are gathered per call
    kind (`peftbd.serving.gather.Gather`: at most `serving.max_batch`, waiting up to
    `serving.batch_wait_ms`) into one call per shard, so transport is paid per batch (a batch
    waits only for its group's requests heading to it, and a verify for its group's requests
    still proposing: `_Course`). A group moves in lockstep; groups do not wait for each other,
    so with two or more the Drafter drafts one group while the Verifier verifies another
    (PEARL-style overlap across requests); one group is the lockstep of every request. Each
    item carries the committed tokens, and each propose the verifier features of its last
    prefill / verify reply (a `FeatureBlock` for the block-diffusion head, else None). A
    request's transport is its share of its calls'."""

    def __init__(self, drafter: DeploymentHandle, verifier: DeploymentHandle,
                 serving: ServingConfig) -> None:
        self.drafter = _Shards(drafter, Role.DRAFTER.deployment, serving.drafter_replicas)
        self.verifier = _Shards(verifier, Role.VERIFIER.deployment, serving.verifier_replicas)
        self.retry = _Retrying(serving)
        self._where: collections.Counter = collections.Counter()
        self._dealt = itertools.count()
        self.groups = serving.split_groups
        count = self._where.__getitem__
        self._gathers = {
            (kind, g): Gather(functools.partial(self._send, target, f"{kind}_batch"),
                              serving.max_batch, serving.batch_wait_ms,
                              functools.partial(count, ("to", kind, g)),
                              # a verify waits for its group's requests still proposing
                              functools.partial(count, ("in", "propose", g)) if kind == "verify"
                              else lambda: 0)
            for kind, target in (("prefill", self.verifier), ("propose", self.drafter),
                                 ("verify", self.verifier))
            for g in range(self.groups)
        }

    async def _send(self, target: _Shards, method: str,
                    items: Sequence[Any]) -> list[Reply | BaseException]:
        """One call per shard, concurrently; a shard whose replica kept dying fails only its
        own items."""
        groups: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(target.key(item.session_id), []).append(i)

        async def shard(key: str, idx: list[int]) -> list[Reply]:
            handle, batch = target.handle.options(session_id=key), [items[i] for i in idx]
            replies, wall = await self.retry.call(
                target.name, lambda: getattr(handle, method).remote(batch))
            share = max(wall - replies[0].handler_ms, 0.0) / len(idx)
            return [(reply, share) for reply in replies]

        out: dict[int, Reply | BaseException] = {}  # item index: its reply or its shard's error
        done = await asyncio.gather(*(shard(k, idx) for k, idx in groups.items()),
                                    return_exceptions=True)
        for idx, result in zip(groups.values(), done):
            for n, i in enumerate(idx):
                out[i] = result if isinstance(result, BaseException) else result[n]
        return [out[i] for i in range(len(items))]

    def _changed(self) -> None:
        for gather in self._gathers.values():
            gather.poke()

    async def _call(self, kind: str, item: PrefillItem | ProposeItem | VerifyItem,
                    course: _Course, expected: type[_R]) -> tuple[_R, float]:
        """(the `expected` reply to `item`, its share of the call's transport ms)."""
        course.move(("in", kind))
        result = await self._gathers[kind, course.group].call(item)
        if isinstance(result, BaseException):
            raise result
        reply, share = result
        if not isinstance(reply, expected):
            raise TypeError(f"a {kind} call answered a {type(reply).__name__}, not a "
                            f"{expected.__name__}")
        return reply, share

    async def rounds(self, spec: GenerationSpec) -> AsyncGenerator[RoundEvent, None]:
        sid, prompt, budget = spec.request_id, list(spec.prompt_ids), spec.max_new_tokens
        first = "verify" if spec.method == "ar" else "propose"  # of each round
        course = _Course(self._where, self._changed, next(self._dealt) % self.groups)
        course.move(("to", "prefill"))
        try:
            started, share = await self._call(
                "prefill", PrefillItem(sid, prompt, budget, spec.method, spec.sampling), course,
                PrefillReply)
            event = prefill_event(started, share, started.batch_size)
            committed = prompt + event.tokens
            course.move(None if event.done else ("to", first))
            yield event
            shipped = started.shipped
            while not event.done:
                proposal: ProposeReply | None = None
                draft_share = 0.0
                if spec.method != "ar":
                    proposal, draft_share = await self._call("propose", ProposeItem(
                        sid, committed, len(prompt), budget, spec.method, shipped, spec.sampling),
                        course, ProposeReply)
                    course.move(("to", "verify"))
                draft = proposal.draft if proposal else []
                reply, verify_share = await self._call("verify", VerifyItem(
                    sid, committed, len(prompt), budget, draft, spec.method, spec.sampling), course,
                    VerifyReply)
                shipped = reply.shipped
                event = split_round(proposal, draft_share, reply, verify_share, reply.batch_size)
                committed = committed + event.tokens
                course.move(None if event.done else ("to", first))
                yield event
        finally:  # also when the client left: see `_detached`
            course.move(None)
            if spec.method != "ar":
                _detached(lambda: self.drafter.to(sid).release.remote(sid))
            _detached(lambda: self.verifier.to(sid).release.remote(sid))


def _detached(call: Callable[[], Any]) -> None:
    """Make a fire-and-forget remote call outside the current request's context: Serve cancels
    the calls a request makes when its client disconnects, and a release must still arrive then.
    A lost release only leaves an entry for the replica's LRU to evict."""
    contextvars.Context().run(call)
