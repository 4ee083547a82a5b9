"""The deployments behind the Ingress: `Engine` (colocated: the whole loop), `Drafter` and
`Verifier` (split), and the split app's round driver `Rounds`.

Thin wrappers over `peftbd.serving.replica.ReplicaDecoder`. The Engine streams each request's
steps from its step loop (concurrent requests batched); Drafter and Verifier take batched calls
(a list of typed items, `peftbd.serving.messages`) routed by a shard key of the items' session ids
(see `serve_apps.args.SESSION_ROUTER` and `serve_apps.backends._Shards`), so a request's rounds
reach the replica that holds its state; any other replica rebuilds it from the committed tokens
the item carries.

`Rounds` (one replica) runs every request's rounds of the split app, whichever Ingress took it
(`peftbd.serving.round_driver`), so each role sees one batch stream per `serving.split_groups`
group; Drafter and Verifier still combine calls that arrive while a batch is in flight
(`peftbd.serving.combine`) into the next batch, up to `serving.max_batch` items (the colocated
Engine's step loop does the same for its requests).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from ray import serve
from ray.serve import Deployment
from ray.serve.handle import DeploymentHandle

from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.methods import AR, methods, serving_names
from peftbd.serving.combine import Combiner
from peftbd.serving.messages import (
    AheadItem,
    AheadReply,
    PrefillItem,
    PrefillReply,
    ProposeItem,
    ProposeReply,
    ReplicaStats,
    VerifyItem,
    VerifyReply,
)
from peftbd.serving.models import load_serving_models
from peftbd.serving.replica import ReplicaDecoder
from peftbd.serving.roles import Role
from peftbd.serving.rounds import RoundEvent
from peftbd.serving.validation import GenerationSpec
from serve_apps.args import MAX_ONGOING, SESSION_ROUTER, AppArgs
from serve_apps.backends import split_driver


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

    def __init__(self, args: dict[str, Any]) -> None:
        app = AppArgs.model_validate(args)
        cfg = app.load()
        models = load_serving_models(cfg, self.serves(), app.drafter_dirs,
                                     references=app.reference_outputs())
        s = cfg.serving
        self.decoder = ReplicaDecoder(models, s.max_sessions, s.max_batch, s.batch_wait_ms)
        self.combiner = Combiner(s.max_batch)

    def release(self, session_id: str) -> None:
        """Forget a finished or abandoned request's state."""
        self.decoder.release(session_id)

    def stats(self) -> ReplicaStats:
        """This replica's id and counters (`ReplicaStats`: sessions, streams, busy seconds,
        batch sizes, prefills, resumes, rounds), returned as the typed object."""
        return self.decoder.stats(serve.get_replica_context().replica_id.unique_id)


@serve.deployment(name=Role.ENGINE.deployment, max_ongoing_requests=MAX_ONGOING)
class Engine(_ModelReplica):
    """Colocated: the verifier and every registered method's drafter (PEFT-BD adapter, MTP head,
    block-diffusion head, ...) in one replica, running the whole loop."""

    @staticmethod
    def serves() -> tuple[str, ...]:
        return serving_names()

    async def rounds(self, prompt_ids: list[int], max_new_tokens: int, method: str,
                     committed: Sequence[int] = (), sampling: SamplingParams = GREEDY
                     ) -> AsyncIterator[RoundEvent]:
        """Stream one request's steps (prefill, then rounds) as `RoundEvent`s (Ray pickles each);
        the replica's step loop batches it with the other requests of its method."""
        async for event in self.decoder.arounds(prompt_ids, max_new_tokens, method, committed,
                                                sampling):
            yield event


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
        forward; `serving.drafter_sync`) and draft its next block: one batched draft per method
        (with the other calls waiting here)."""
        return await self.combiner.call("propose", self.decoder.propose_batch, items)

    async def ahead_batch(self, items: list[AheadItem]) -> list[AheadReply]:
        """Draft each request's next round for a guessed outcome of the round now verifying
        (`serving.draft_ahead`; no guess where its method cannot draft ahead)."""
        return await self.combiner.call("ahead", self.decoder.ahead_batch, items)


@serve.deployment(name=Role.VERIFIER.deployment, max_ongoing_requests=MAX_ONGOING,
                  request_router_config=SESSION_ROUTER)
class Verifier(_ModelReplica):
    """Split: the verifier (no adapter) and its sessions."""

    @staticmethod
    def serves() -> tuple[str, ...]:
        return (AR,)

    async def prefill_batch(self, items: list[PrefillItem]) -> list[PrefillReply]:
        """Start requests; commits each one's first token (with the features its drafter
        reads): one batched prefill (with the other calls waiting here)."""
        return await self.combiner.call("prefill", self.decoder.prefill_batch, items)

    async def verify_batch(self, items: list[VerifyItem]) -> list[VerifyReply]:
        """Verify each draft after its `committed`; commits its accepted prefix plus the bonus
        token and ships what the request's drafter reads of it: one batched verify (with the
        other calls waiting here)."""
        return await self.combiner.call("verify", self.decoder.verify_batch, items)


@serve.deployment(name=Role.ROUNDS.deployment, max_ongoing_requests=256)
class Rounds:
    """Split: the app's round driver, one replica holding every request's rounds (from both
    Ingress replicas) and keeping the Drafter and the Verifier each fed with the next ready
    batch (`peftbd.serving.round_driver.RoundDriver`)."""

    def __init__(self, args: dict[str, Any], drafter: DeploymentHandle,
                 verifier: DeploymentHandle) -> None:
        self.driver = split_driver(drafter, verifier, AppArgs.model_validate(args).load().serving)

    async def rounds(self, spec: GenerationSpec, committed: Sequence[int] = ()
                     ) -> AsyncIterator[RoundEvent]:
        """Stream one request's steps (its prefill unless `committed` extends its prompt: a
        request resumed after a lost driver, then its rounds) as `RoundEvent`s."""
        async for event in self.driver.rounds(spec, committed):
            yield event
