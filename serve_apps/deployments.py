"""The model deployments: `Engine` (colocated: the whole loop), `Drafter` and `Verifier` (split).

Thin wrappers over `peftbd.serving.replica.ReplicaDecoder`: plain lists and dicts in and out.
Drafter and Verifier route by `session_id` (see `serve_apps.args.SESSION_ROUTER`), so a request's
rounds reach the replica that holds its state; any other replica rebuilds it from the committed
tokens the call carries.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ray import serve

from peftbd.serving.features import FeatureBlock
from peftbd.serving.models import load_serving_models
from peftbd.serving.replica import ReplicaDecoder
from peftbd.serving.schemas import METHODS
from serve_apps.args import MAX_ONGOING, SESSION_ROUTER, AppArgs


class _ModelReplica:
    """Loads the models of `methods` and keeps this replica's sessions."""

    methods: tuple[str, ...] = ()

    def __init__(self, args: dict[str, Any]) -> None:
        app = AppArgs.model_validate(args)
        cfg = app.load()
        models = load_serving_models(cfg, self.methods, app.adapter_dir, app.mtp_dir,
                                     head_dir=app.head_dir)
        self.decoder = ReplicaDecoder(models, cfg.serving.max_sessions)

    def release(self, session_id: str) -> None:
        """Forget a finished or abandoned request's state."""
        self.decoder.release(session_id)

    def stats(self) -> dict[str, Any]:
        """This replica's id, its counters (prefills, resumes, rounds), open sessions (split) and
        running loops (colocated)."""
        return {"replica": serve.get_replica_context().replica_id.unique_id,
                "sessions": len(self.decoder.sessions), "streams": self.decoder.streams,
                **self.decoder.counters}


@serve.deployment(name="Engine", max_ongoing_requests=MAX_ONGOING)
class Engine(_ModelReplica):
    """Colocated: verifier, adapter, MTP head and block-diffusion head in one replica, running
    the whole loop."""

    methods = METHODS

    def rounds(self, prompt_ids: list[int], max_new_tokens: int, method: str,
               committed: Sequence[int] = ()) -> Iterator[dict[str, Any]]:
        """Stream one request's steps (prefill, then rounds) as `RoundEvent` dicts."""
        for event in self.decoder.rounds(prompt_ids, max_new_tokens, method, committed):
            yield event.to_dict()


@serve.deployment(name="Drafter", max_ongoing_requests=MAX_ONGOING,
                  request_router_config=SESSION_ROUTER)
class Drafter(_ModelReplica):
    """Split: the drafters (PEFT-BD adapter on the backbone, MTP head, block-diffusion head) and
    their sessions."""

    methods = tuple(m for m in METHODS if m != "ar")

    def propose(self, session_id: str, committed: list[int], prompt_len: int,
                max_new_tokens: int, method: str,
                features: FeatureBlock | None = None) -> dict[str, Any]:
        """Catch up with `committed` (the head: with the verifier's `features`, no forward) and
        draft the next block."""
        return self.decoder.propose(session_id, committed, prompt_len, max_new_tokens, method,
                                    features)


@serve.deployment(name="Verifier", max_ongoing_requests=MAX_ONGOING,
                  request_router_config=SESSION_ROUTER)
class Verifier(_ModelReplica):
    """Split: the verifier (no adapter) and its sessions."""

    methods = ("ar",)

    def prefill(self, session_id: str, prompt_ids: list[int], max_new_tokens: int,
                method: str = "ar") -> dict[str, Any]:
        """Start a request; commits its first token (with the features its drafter reads)."""
        return self.decoder.prefill(session_id, prompt_ids, max_new_tokens, method)

    def verify(self, session_id: str, committed: list[int], prompt_len: int,
               max_new_tokens: int, draft: list[int], method: str = "ar") -> dict[str, Any]:
        """Verify `draft` after `committed`; commits the accepted prefix plus the bonus token."""
        return self.decoder.verify(session_id, committed, prompt_len, max_new_tokens, draft,
                                   method)
