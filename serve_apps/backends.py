"""How the ingress gets a request's steps: from the colocated `Engine`, or by running the rounds
over the split `Drafter` and `Verifier` handles. Both yield `RoundEvent`s and survive a dead
replica by resuming elsewhere from the committed tokens (at most `serving.round_retries` times,
then a clear `BackendUnavailable`)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

from peftbd.config import ServingConfig
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

    async def rounds(self, spec: GenerationSpec) -> AsyncIterator[RoundEvent]:
        """Transport per step = the wall time between two events minus the step's compute."""
        committed = list(spec.prompt_ids)
        for attempt in range(self.retry.retries + 1):
            stream = self.engine.rounds.remote(
                spec.prompt_ids, spec.max_new_tokens, spec.method, committed
            )
            try:
                last = time.perf_counter()
                async for item in stream:
                    event = RoundEvent(**item)
                    now = time.perf_counter()
                    event.transport_ms = max((now - last) * 1e3 - event.compute_ms, 0.0)
                    last = now
                    committed.extend(event.tokens)
                    yield event
                return
            except REPLICA_LOST as exc:
                self.retry.failed("Engine", attempt, exc)


class SplitBackend:
    """Runs the rounds: Drafter.propose then Verifier.verify, pinned to the request's replicas
    by `session_id`; each call carries the committed tokens, and each propose the verifier
    features of the last prefill / verify reply (a `FeatureBlock` for the block-diffusion head,
    else None)."""

    def __init__(self, drafter: DeploymentHandle, verifier: DeploymentHandle,
                 serving: ServingConfig) -> None:
        self.drafter, self.verifier = drafter, verifier
        self.retry = _Retrying(serving)

    async def rounds(self, spec: GenerationSpec) -> AsyncIterator[RoundEvent]:
        sid, prompt, budget = spec.request_id, list(spec.prompt_ids), spec.max_new_tokens
        drafter = self.drafter.options(session_id=sid)
        verifier = self.verifier.options(session_id=sid)
        try:
            reply, wall = await self.retry.call(
                "Verifier", lambda: verifier.prefill.remote(sid, prompt, budget, spec.method))
            event = prefill_event(reply, wall)
            committed = prompt + event.tokens
            yield event
            while not event.done:
                proposal, draft_wall, features = None, 0.0, reply["features"]
                if spec.method != "ar":
                    proposal, draft_wall = await self.retry.call("Drafter", lambda: drafter.propose.remote(
                        sid, committed, len(prompt), budget, spec.method, features))
                draft = proposal["draft"] if proposal else []
                reply, verify_wall = await self.retry.call("Verifier", lambda: verifier.verify.remote(
                    sid, committed, len(prompt), budget, draft, spec.method))
                event = split_round(proposal, draft_wall, reply, verify_wall)
                committed = committed + event.tokens
                yield event
        finally:  # also when the client left: see `_detached`
            if spec.method != "ar":
                _detached(lambda: drafter.release.remote(sid))
            _detached(lambda: verifier.release.remote(sid))


def _detached(call: Callable[[], Any]) -> None:
    """Make a fire-and-forget remote call outside the current request's context: Serve cancels
    the calls a request makes when its client disconnects, and a release must still arrive then.
    A lost release only leaves an entry for the replica's LRU to evict."""
    contextvars.Context().run(call)
