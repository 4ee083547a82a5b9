"""The deployments behind the Ingress: `Engine` (colocated: the whole loop), and the split app's
`Verifier` (the whole loop but the drafts) and `Drafter` (every method's drafter).

Thin wrappers over `peftbd.serving.replica.ReplicaDecoder`. The Engine and the Verifier stream
each request's steps from their step loop (the engine's scheduler: concurrent requests batched);
the Verifier's drafts come from batched calls to the Drafter (a list of typed items,
`peftbd.serving.messages`) routed by a shard key of the items' session ids (see
`serve_apps.args.SESSION_ROUTER` and `serve_apps.backends.DrafterHandleCalls`), so a request's
rounds reach the Drafter replica that holds its state; any other replica rebuilds it from the
committed tokens the item carries. Calls that reach a Drafter replica together run one after
the other (its model lock), each one batched forward per method.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ray import serve
from ray.serve import Deployment
from ray.serve.handle import DeploymentHandle

from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.methods import AR, methods, serving_names
from peftbd.serving.messages import AheadItem, AheadReply, ProposeItem, ProposeReply, ReplicaStats
from peftbd.serving.models import load_serving_models
from peftbd.serving.replica import ReplicaDecoder
from peftbd.serving.roles import Role
from peftbd.serving.rounds import RoundEvent
from serve_apps.args import MAX_ONGOING, SESSION_ROUTER, AppArgs
from serve_apps.backends import DrafterHandleCalls


def deployment_of(decorated: object) -> Deployment:
    """A `@serve.deployment` class as the `Deployment` the decorator made it (the type checker
    keeps a decorated class's own type, which has no `.options` / `.bind`)."""
    if not isinstance(decorated, Deployment):
        raise TypeError(f"{decorated!r} is no Serve deployment")
    return decorated


class _ModelReplica:
    """Loads the models of the methods it `serves` and keeps this replica's sessions."""

    @staticmethod
    def serves() -> tuple[str, ...]:
        """The serving names whose decoders this deployment loads (from the registry)."""
        raise NotImplementedError

    def __init__(self, args: dict[str, Any], drafter: DeploymentHandle | None = None) -> None:
        app = AppArgs.model_validate(args)
        cfg = app.load()
        models = load_serving_models(cfg, self.serves(), app.drafter_dirs,
                                     references=app.reference_outputs())
        s = cfg.serving
        calls = None if drafter is None else DrafterHandleCalls(drafter, s)
        self.decoder = ReplicaDecoder(models, s.max_sessions, s.max_batch, s.batch_wait_ms, calls,
                                      s.split_groups if calls else 1, s.draft_ahead)

    def release(self, session_id: str) -> None:
        """Forget a finished or abandoned request's state."""
        self.decoder.release(session_id)

    def stats(self) -> ReplicaStats:
        """This replica's id and counters (`ReplicaStats`: sessions, streams, busy seconds,
        batch sizes, prefills, resumes, rounds), returned as the typed object."""
        return self.decoder.stats(serve.get_replica_context().replica_id.unique_id)


class _Streams(_ModelReplica):
    """A replica that runs requests' whole loops in its step loop and streams their steps."""

    async def rounds(self, prompt_ids: list[int], max_new_tokens: int, method: str,
                     committed: Sequence[int] = (), sampling: SamplingParams = GREEDY
                     ) -> AsyncIterator[RoundEvent]:
        """Stream one request's steps (prefill, then rounds) as `RoundEvent`s (Ray pickles each);
        the replica's step loop batches it with the other requests of its method. `committed`
        longer than the prompt resumes a request whose replica was lost."""
        async for event in self.decoder.arounds(prompt_ids, max_new_tokens, method, committed,
                                                sampling):
            yield event


@serve.deployment(name=Role.ENGINE.deployment, max_ongoing_requests=MAX_ONGOING)
class Engine(_Streams):
    """Colocated: the verifier and every registered method's drafter (PEFT-BD adapter, MTP head,
    block-diffusion head, ...) in one replica, running the whole loop."""

    @staticmethod
    def serves() -> tuple[str, ...]:
        return serving_names()


@serve.deployment(name=Role.VERIFIER.deployment, max_ongoing_requests=MAX_ONGOING)
class Verifier(_Streams):
    """Split: the verifier (no adapter) running every request's loop, its drafts made by the
    `Drafter` deployment (`drafter`, its handle); it ships each drafter the verifier state its
    method reads (`Method.ships`)."""

    @staticmethod
    def serves() -> tuple[str, ...]:
        return (AR,)

    def __init__(self, args: dict[str, Any], drafter: DeploymentHandle) -> None:
        super().__init__(args, drafter)


@serve.deployment(name=Role.DRAFTER.deployment, max_ongoing_requests=MAX_ONGOING,
                  request_router_config=SESSION_ROUTER)
class Drafter(_ModelReplica):
    """Split: every registered method's drafter (PEFT-BD adapter on the backbone, MTP head,
    block-diffusion head, ...) and their sessions."""

    @staticmethod
    def serves() -> tuple[str, ...]:
        return tuple(m.serving for m in methods())

    async def propose_batch(self, items: list[ProposeItem]) -> list[ProposeReply]:
        """Catch each request up with its `committed` (with what the Verifier shipped, no
        forward; `serving.drafter_sync`) and draft its next block: one batched draft per method."""
        return await asyncio.to_thread(self.decoder.propose_batch, items)

    async def ahead_batch(self, items: list[AheadItem]) -> list[AheadReply]:
        """Draft each request's next round for a guessed outcome of the round now verifying
        (`serving.draft_ahead`; no guess where its method cannot draft ahead)."""
        return await asyncio.to_thread(self.decoder.ahead_batch, items)
