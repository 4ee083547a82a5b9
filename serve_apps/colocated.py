"""The `colocated` app: Ingress -> one `Engine` deployment that holds the verifier, the PEFT-BD
adapter and the MTP head and runs each request's whole loop.

    serve run serve_apps.colocated:app_builder preset=tiny
    serve deploy serve_apps/colocated.yaml
"""

from __future__ import annotations

from ray.serve import Application

from serve_apps.args import AppArgs, actor_options
from serve_apps.deployments import Engine
from serve_apps.ingress import Ingress


def app_builder(args: AppArgs) -> Application:
    """Build the app from its args (`preset`, `config`, `overrides`, `adapter_dir`, `mtp_dir`)."""
    cfg = args.load()
    plain = args.model_dump()
    engine = Engine.options(**actor_options(cfg, "engine")).bind(plain)
    return Ingress.options(**actor_options(cfg, "ingress")).bind(plain, engine=engine)
