"""How the ingress gets a request's steps: streamed from the replica that runs its rounds (the
colocated `Engine`, or the split app's `Verifier`, whose step loop proposes through the `Drafter`:
`DrafterHandleCalls`). Every hop survives a dead replica by resuming elsewhere from the
committed tokens (at most `serving.round_retries` times, then a clear `BackendUnavailable`)."""

from __future__ import annotations

import contextvars
import logging
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any, TypeVar, cast

from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponse

from peftbd.config import ServingConfig
from peftbd.serving.messages import AheadItem, AheadReply, ProposeItem, ProposeReply
from peftbd.serving.roles import Role
from peftbd.serving.rounds import RoundEvent
from peftbd.serving.validation import GenerationSpec

log = logging.getLogger("ray.serve")

REPLICA_LOST = (RayActorError,)
"""Errors of a call whose replica died or became unreachable (ActorDiedError, ...Unavailable)."""

_R = TypeVar("_R", ProposeReply, AheadReply)


class BackendUnavailable(RuntimeError):
    """A request's replica kept dying; the message says which deployment and how often."""


class _Retrying:
    """Counts a request's lost replicas; past `serving.round_retries` the request fails."""

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


class StreamBackend:
    """Streams a request's steps from one replica of `role` (the colocated `Engine` or the split
    `Verifier`: the replica that runs its rounds); a lost replica's request restarts on another
    from the tokens already committed. Transport per step = the wall time between two events
    minus the replica's time in it (`RoundEvent.replica_ms`: its compute and its waits), plus a
    split Verifier's hops to its Drafter."""

    def __init__(self, handle: DeploymentHandle, serving: ServingConfig, role: Role) -> None:
        self.handle = handle.options(stream=True)
        self.retry = _Retrying(serving)
        self.role = role

    def _open(self, spec: GenerationSpec, committed: list[int]) -> AsyncIterator[RoundEvent]:
        # a streaming handle's call: the `RoundEvent`s the replica's `rounds` yields, as objects
        return cast("AsyncIterator[RoundEvent]", self.handle.rounds.remote(
            spec.prompt_ids, spec.max_new_tokens, spec.method, committed, spec.sampling))

    async def rounds(self, spec: GenerationSpec) -> AsyncGenerator[RoundEvent, None]:
        committed = list(spec.prompt_ids)
        for attempt in range(self.retry.retries + 1):
            stream = self._open(spec, committed)
            try:
                last = time.perf_counter()
                async for event in stream:
                    now = time.perf_counter()
                    # the hop here; a split Verifier's hops to its Drafter came filled in
                    event.transport_ms += max((now - last) * 1e3 - event.replica_ms
                                              - event.transport_ms, 0.0)
                    last = now
                    committed.extend(event.tokens)
                    yield event
                return
            except REPLICA_LOST as exc:
                self.retry.failed(self.role.deployment, attempt, exc)


class DrafterHandleCalls:
    """A split Verifier's calls to the Drafter deployment (`peftbd.serving.remote_drafter.
    DrafterCalls`), made from its step loop's threads: a batch becomes one call per shard (its
    items' session ids hashed into `serving.drafter_replicas` shard keys, so a request's calls
    keep reaching the replica that holds its session, by Ray's consistent hashing of the key),
    retried after a lost replica (the next replica rebuilds the session from the committed
    tokens); a release is fire and forget."""

    def __init__(self, handle: DeploymentHandle, serving: ServingConfig) -> None:
        self.handle, self.shards = handle, serving.drafter_replicas
        self.retry = _Retrying(serving)

    def key(self, session_id: str) -> str:
        return f"{Role.DRAFTER.deployment}-{zlib.crc32(session_id.encode()) % self.shards}"

    def propose(self, items: Sequence[ProposeItem]) -> list[ProposeReply]:
        return self._calls("propose_batch", items, ProposeReply)()

    def ahead(self, items: Sequence[AheadItem]) -> Callable[[], list[AheadReply]]:
        return self._calls("ahead_batch", items, AheadReply)

    def release(self, session_id: str) -> None:
        handle = self.handle.options(session_id=self.key(session_id))
        _detached(lambda: handle.release.remote(session_id))

    def _calls(self, method: str, items: Sequence[Any], expected: type[_R]
               ) -> Callable[[], list[_R]]:
        """Send one call per shard now; what waits for the replies (in item order)."""
        shards: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            shards.setdefault(self.key(item.session_id), []).append(i)

        def send(key: str, idx: list[int]) -> DeploymentResponse:
            handle = self.handle.options(session_id=key)
            return getattr(handle, method).remote([items[i] for i in idx])

        sent = {key: send(key, idx) for key, idx in shards.items()}

        def replies() -> list[_R]:
            out: dict[int, _R] = {}
            for key, idx in shards.items():
                for attempt in range(self.retry.retries + 1):
                    try:
                        got = sent[key].result(timeout_s=None if attempt == 0 else self.retry.timeout_s)
                        break
                    except REPLICA_LOST as exc:
                        self.retry.failed(Role.DRAFTER.deployment, attempt, exc)
                        sent[key] = send(key, idx)
                for i, reply in zip(idx, got, strict=True):
                    if not isinstance(reply, expected):
                        raise TypeError(f"a Drafter {method} answered a {type(reply).__name__}, "
                                        f"not a {expected.__name__}")
                    out[i] = reply
            return [out[i] for i in range(len(items))]

        return replies


def _detached(call: Callable[[], Any]) -> None:
    """Make a fire-and-forget remote call outside the current request's context: Serve cancels
    the calls a request makes when its client disconnects, and a release must still arrive then.
    A lost release only leaves an entry for the replica's LRU to evict."""
    contextvars.Context().run(call)
