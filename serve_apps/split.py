"""The `split` app: Ingress runs the rounds over a `Drafter` deployment (every registered
method's drafter: PEFT-BD adapter on the backbone, the MTP head, the block-diffusion head, ...) and
a `Verifier` deployment (adapter off; it ships each drafter the verifier state its method reads,
`Method.ships`), each with its own replicas and resources; a request's rounds stick to one
replica of each by session id.

    serve run serve_apps.split:app_builder preset=tiny
    serve deploy serve_apps/local.yaml            # local, with the colocated app, on /split
    serve deploy serve_apps/split_cluster.yaml    # GPU cluster: `drafter` / `verifier` resources
"""
# No `from __future__ import annotations`: Serve reads `app_builder`'s `args` annotation at
# runtime to validate the config's `args` into `AppArgs`.

from typing import Any

from ray.serve import Application

from serve_apps.args import AppArgs, actor_options
from serve_apps.deployments import Drafter, Verifier
from serve_apps.ingress import Ingress


def build(args: AppArgs, options: dict[str, dict[str, Any]] | None = None) -> Application:
    """The app; `options` (by role: `drafter`, `verifier`, `ingress`) replaces the
    `.options(...)` that `cfg.serving` gives (placement experiments)."""
    cfg = args.load()
    roles = ("drafter", "verifier", "ingress")
    opts = {role: actor_options(cfg, role) for role in roles} | (options or {})
    plain = args.model_dump()
    drafter = Drafter.options(**opts["drafter"]).bind(plain)
    verifier = Verifier.options(**opts["verifier"]).bind(plain)
    return Ingress.options(**opts["ingress"]).bind(plain, drafter=drafter, verifier=verifier)


def app_builder(args: AppArgs) -> Application:
    """Serve's entry point (`import_path: serve_apps.split:app_builder`)."""
    return build(args)
