"""How each named placement (`serving.placements`) maps to Serve deployments: the app, the
per-role `.options(...)` on cluster.yaml's node types, the config it changes, whether a cluster
can host it, and the replicas it runs."""

from __future__ import annotations

from typing import Any

from peftbd.analysis.placement_ahead import AHEAD
from peftbd.config import Config
from peftbd.serving.roles import MODEL_ROLES, Role
from serve_apps.args import actor_options


def placement_options(name: str, cfg: Config) -> tuple[str, dict[str, dict[str, Any]]]:
    """(app, per-role `.options(...)` overrides) of a named placement.

    colocated: drafter_replicas + verifier_replicas Engine replicas (split's devices).
    split-cross-node: Drafter on a `drafter` node, Verifier on a `verifier` node, whole GPUs.
    split-same-node: both on one `verifier` node, sharing its GPU (half each).
    split-fractional-gpu: cross-node with two replicas of each at half a GPU.
    split-forward: split whose Drafter catches up with its own verifier forward
    (`serving.drafter_sync: forward`) instead of the state the Verifier ships.
    split-ahead: split whose Drafter drafts the next round during each verify
    (`serving.draft_ahead`), at `serving.ahead_levels` only (`placement_levels`).
    """
    s = cfg.serving

    def role(resource: str, share: float, gpus: float, replicas: int = 1) -> dict[str, Any]:
        return {"num_replicas": replicas, "ray_actor_options": {
            "num_cpus": s.replica_num_cpus, "num_gpus": gpus, "resources": {resource: share}}}

    engines = {"num_replicas": s.drafter_replicas + s.verifier_replicas,  # the same devices
               "ray_actor_options": {"num_cpus": s.replica_num_cpus,
                                     "num_gpus": s.verifier_num_gpus}}
    drafter, verifier = Role.DRAFTER, Role.VERIFIER
    table: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {
        "colocated": ("colocated", {Role.ENGINE: engines}),
        "split": ("split", {}),
        "split-forward": ("split", {}),  # with CONFIG_CHANGES
        "split-ahead": ("split", {}),  # ditto
        "split-cross-node": ("split", {drafter: role("drafter", 1, s.drafter_num_gpus),
                                       verifier: role("verifier", 1, s.verifier_num_gpus)}),
        "split-same-node": ("split", {drafter: role("verifier", 0.5, s.drafter_num_gpus / 2),
                                      verifier: role("verifier", 0.5, s.verifier_num_gpus / 2)}),
        "split-fractional-gpu": ("split", {
            drafter: role("drafter", 0.5, s.drafter_num_gpus / 2, replicas=2),
            verifier: role("verifier", 0.5, s.verifier_num_gpus / 2, replicas=2)}),
    }
    if name not in table:
        raise ValueError(f"serving.placements: unknown placement {name!r}; known: {list(table)}")
    return table[name]


CONFIG_CHANGES = {"split-forward": ["serving.drafter_sync=forward"],
                  AHEAD: ["serving.draft_ahead=true"]}
"""Placements that change the app's config: split with the Drafter's own catch-up forward
instead of the Verifier's shipped state (bytes against ms); split drafting ahead."""


def placement_levels(name: str, cfg: Config) -> tuple[int, ...]:
    """The client levels a placement runs: `serving.ahead_levels` for split-ahead (drafting
    ahead uses a Drafter's idle time, which low levels have), else `serving.client_concurrency`."""
    return cfg.serving.ahead_levels if name == AHEAD else cfg.serving.client_concurrency


def skip_reason(options: dict[str, dict[str, Any]], available: dict[str, float]) -> str | None:
    """Why this cluster cannot host a placement's `options` (None: it can)."""
    needed = {r for o in options.values() for r in o["ray_actor_options"].get("resources", {})}
    missing = sorted(needed - set(available))
    if missing:
        return (f"needs the custom resources {missing} of cluster.yaml's GPU node types; this "
                f"cluster has {sorted(k for k in available if not k.startswith('node:'))}")
    return None


def replica_counts(app: str, options: dict[str, dict[str, Any]], cfg: Config) -> dict[Role, int]:
    """{role: replicas} of the model deployments of a deployed placement."""
    return {r: (options.get(r) or actor_options(cfg, r))["num_replicas"] for r in MODEL_ROLES[app]}
