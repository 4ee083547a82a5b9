"""The `split` app: Ingress -> a `Verifier` deployment (adapter off; the engine's scheduler runs
every request's rounds there) -> a `Drafter` deployment (every registered method's drafter:
PEFT-BD adapter on the backbone, the MTP head, the block-diffusion head, ...), each with its own
replicas and resources. The Verifier ships each drafter the verifier state its method reads
(`Method.ships`); a request's proposes stick to one Drafter replica by session id.

    serve run serve_apps.split:app_builder preset=tiny
    serve deploy serve_apps/local.yaml            # local, with the colocated app, on /split
    serve deploy serve_apps/split_cluster.yaml    # GPU cluster: `drafter` / `verifier` resources
"""
# No `from __future__ import annotations`: Serve reads `app_builder`'s `args` annotation at
# runtime to validate the config's `args` into `AppArgs`.

from typing import Any

from ray.serve import Application

from peftbd.serving.roles import APP_ROLES, Role
from serve_apps.args import AppArgs, actor_options
from serve_apps.deployments import Drafter, Verifier, deployment_of
from serve_apps.ingress import Ingress


def build(args: AppArgs, options: dict[str, dict[str, Any]] | None = None) -> Application:
    """The app; `options` (by role, `Role`: `drafter`, `verifier`, `ingress`)
    replaces the `.options(...)` that `cfg.serving` gives (placement experiments)."""
    cfg = args.load()
    opts: dict[str, dict[str, Any]] = {role: actor_options(cfg, role)
                                       for role in APP_ROLES["split"]}
    opts |= options or {}
    plain = args.model_dump()
    drafter = deployment_of(Drafter).options(**opts[Role.DRAFTER]).bind(plain)
    verifier = deployment_of(Verifier).options(**opts[Role.VERIFIER]).bind(plain, drafter)
    return deployment_of(Ingress).options(**opts[Role.INGRESS]).bind(plain, verifier=verifier)


def app_builder(args: AppArgs) -> Application:
    """Serve's entry point (`import_path: serve_apps.split:app_builder`)."""
    return build(args)
