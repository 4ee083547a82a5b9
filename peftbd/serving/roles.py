"""The serving apps' deployments by role: one name per role for the app builders
(`serve_apps.colocated` / `split`: the `.options(...)` overrides they take by role), the
deployments themselves (`@serve.deployment(name=...)`), the ingress's backends and the placement
experiment (which looks a deployment up by role and reports each role's replica load). Plain
names: no Ray here."""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    """A deployment's role; its value is the role's key in `.options(...)` overrides, in
    `serve_apps.args.actor_options` and in placement.json's per-role loads."""

    INGRESS = "ingress"
    ENGINE = "engine"  # colocated: the verifier and every drafter, the whole loop
    DRAFTER = "drafter"  # split: every drafter
    VERIFIER = "verifier"  # split: the verifier, running every request's rounds

    def __str__(self) -> str:
        return self.value

    @property
    def deployment(self) -> str:
        """The Ray Serve deployment name of this role (what `serve.get_deployment_handle`,
        `serve status` and a serve config's `deployments:` call it)."""
        return DEPLOYMENT_NAMES[self]


DEPLOYMENT_NAMES: dict[Role, str] = {
    Role.INGRESS: "Ingress", Role.ENGINE: "Engine", Role.DRAFTER: "Drafter",
    Role.VERIFIER: "Verifier",
}
"""Role -> its Ray Serve deployment name."""

MODEL_ROLES: dict[str, tuple[Role, ...]] = {
    "colocated": (Role.ENGINE,), "split": (Role.DRAFTER, Role.VERIFIER)}
"""App -> the roles of its model deployments (each app also has an `Role.INGRESS`)."""

APP_ROLES: dict[str, tuple[Role, ...]] = {
    "colocated": (Role.ENGINE, Role.INGRESS),
    "split": (Role.DRAFTER, Role.VERIFIER, Role.INGRESS)}
"""App -> the roles of all its deployments."""

VERIFIER_ROLES = (Role.ENGINE, Role.VERIFIER)
"""The roles whose replicas hold a verifier."""
