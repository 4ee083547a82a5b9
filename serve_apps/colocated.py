"""The `colocated` app: Ingress -> one `Engine` deployment that holds the verifier and every
registered method's drafter (`peftbd.methods`) and runs each request's whole loop.

    serve run serve_apps.colocated:app_builder preset=tiny
    serve deploy serve_apps/local.yaml            # with the split app, on /colocated
"""
# No `from __future__ import annotations`: Serve reads `app_builder`'s `args` annotation at
# runtime to validate the config's `args` into `AppArgs`.

from typing import Any

from ray.serve import Application

from peftbd.serving.roles import APP_ROLES, Role
from serve_apps.args import AppArgs, actor_options
from serve_apps.deployments import Engine, deployment_of
from serve_apps.ingress import Ingress


def build(args: AppArgs, options: dict[str, dict[str, Any]] | None = None) -> Application:
    """The app; `options` (by role, `Role`: `engine`, `ingress`) replaces the `.options(...)`
    that `cfg.serving` gives (placement experiments)."""
    cfg = args.load()
    opts: dict[str, dict[str, Any]] = {role: actor_options(cfg, role)
                                       for role in APP_ROLES["colocated"]}
    opts |= options or {}
    plain = args.model_dump()
    engine = deployment_of(Engine).options(**opts[Role.ENGINE]).bind(plain)
    return deployment_of(Ingress).options(**opts[Role.INGRESS]).bind(plain, engine=engine)


def app_builder(args: AppArgs) -> Application:
    """Serve's entry point (`import_path: serve_apps.colocated:app_builder`)."""
    return build(args)
