"""The `split` app: Ingress runs the rounds over a `Drafter` deployment (PEFT-BD adapter on the
backbone, or the MTP head) and a `Verifier` deployment (adapter off), each with its own replicas
and resources; a request's rounds stick to one replica of each by session id.

    serve run serve_apps.split:app_builder preset=tiny
    serve deploy serve_apps/split.yaml            # local
    serve deploy serve_apps/split_cluster.yaml    # GPU cluster: `drafter` / `verifier` resources
"""

from __future__ import annotations

from ray.serve import Application

from serve_apps.args import AppArgs, actor_options
from serve_apps.deployments import Drafter, Verifier
from serve_apps.ingress import Ingress


def app_builder(args: AppArgs) -> Application:
    """Build the app from its args (`preset`, `config`, `overrides`, `adapter_dir`, `mtp_dir`)."""
    cfg = args.load()
    plain = args.model_dump()
    drafter = Drafter.options(**actor_options(cfg, "drafter")).bind(plain)
    verifier = Verifier.options(**actor_options(cfg, "verifier")).bind(plain)
    return Ingress.options(**actor_options(cfg, "ingress")).bind(
        plain, drafter=drafter, verifier=verifier
    )
