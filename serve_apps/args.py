"""Application arguments (the `args:` of a serve config) and per-deployment Ray options."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from peftbd.config import Config, load_config, load_plugins
from peftbd.methods import methods, renamed
from peftbd.process_setup import ready
from peftbd.serving.roles import Role
from peftbd.serving.synthetic import read_references, synthetic_rates
from peftbd.serving.validation import check_serving_config

SESSION_ROUTER = {
    "request_router_class": "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter",
    # one fallback replica: a dead replica's sessions move on (and re-prefill there) instead of
    # waiting for it to be replaced; backpressure fallback is avoided by a high max_ongoing_requests
    "request_router_kwargs": {"num_fallback_replicas": 1},
}
"""Session-sticky routing (Ray Serve 2.60): a request's rounds carry `session_id` = its id, so they
hash to the same Drafter / Verifier replica, the one that holds its KV caches."""

MAX_ONGOING = 64
"""Requests one model replica accepts at once (they interleave round by round)."""


class AppArgs(BaseModel):
    """What both apps take: the config (preset, YAML file, --set overrides) and trained drafters.

    `drafter_dirs`: {method: its trained output dir} (`python -m jobs.train --method <id>`), for any
    method of `peftbd.methods`; each method's own argument (`Method.dir_arg`: `peftbd_dir` for
    PEFT-BD, `fastmtp_dir` for FastMTP, `peftbd_head_dir` for the block-diffusion head, ...) says the same
    (null: untrained). A method without one drafts untrained (exact output, low acceptance).
    `references`: a JSON file of greedy AR outputs ({"references": [{"prompt": ids, "output":
    ids}, ...]}, as `jobs.placement` writes) that the `serving.synthetic` methods' oracle starts
    from; prompts not in it are decoded with greedy AR when first seen.
    """

    model_config = ConfigDict(extra="forbid")

    preset: str = "tiny"
    config: str | None = None
    overrides: list[str] = []
    drafter_dirs: dict[str, str] = {}
    references: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _fold_dir_args(cls, data: Any) -> Any:
        """Each registered method's `<dir_arg>` into `drafter_dirs` (null: untrained)."""
        if not isinstance(data, dict):
            return data
        # a methods.plugins method's argument is known once its module is imported
        load_plugins(data.get("preset", "tiny"), data.get("config"), data.get("overrides") or [])
        dir_args = [m.dir_arg for m in methods()]
        unknown = sorted(set(data) - set(cls.model_fields) - set(dir_args))
        for name in unknown:
            if (new := renamed(name)) is not None:
                raise ValueError(f"argument {name!r} was renamed to {new!r}")
        if unknown:
            raise ValueError(f"unknown argument {unknown[0]!r}; the apps take "
                             f"{', '.join([*cls.model_fields, *dir_args])}")
        data, dirs = dict(data), dict(data.get("drafter_dirs") or {})
        for m in methods():
            path = data.pop(m.dir_arg, None)
            if path is None:
                continue
            if dirs.get(m.serving, path) != path:
                raise ValueError(f"{m.dir_arg}={path!r} and drafter_dirs[{m.serving!r}]="
                                 f"{dirs[m.serving]!r} disagree; give {m.serving}'s dir once")
            dirs[m.serving] = path
        return {**data, "drafter_dirs": dirs}

    @field_validator("drafter_dirs")
    @classmethod
    def _registered(cls, dirs: dict[str, str]) -> dict[str, str]:
        drafting = [m.serving for m in methods()]
        unknown = sorted(set(dirs) - set(drafting))
        for name in unknown:
            if (new := renamed(name)) is not None:
                raise ValueError(f"drafter_dirs key {name!r} was renamed to {new!r}")
        if unknown:
            raise ValueError(f"{unknown[0]!r} is no drafting method; key it by one of {drafting} "
                             f"(or its own argument: {', '.join(m.dir_arg for m in methods())})")
        return dirs

    def load(self) -> Config:
        """The config these args name, checked for serving."""
        cfg = ready(load_config(self.preset, self.config, self.overrides))  # plugins, the world
        check_serving_config(cfg.serving)
        synthetic_rates(cfg)
        return cfg

    def reference_outputs(self) -> dict[tuple[int, ...], Sequence[int]]:
        """{prompt ids: greedy AR output} from `references` (none: {})."""
        return read_references(Path(self.references)) if self.references else {}


def actor_options(cfg: Config, role: str) -> dict[str, Any]:
    """`.options(...)` of a deployment from `cfg.serving`: replicas and resources per role
    (a `Role` or its value: `ingress`, `engine` = colocated, `drafter`, `verifier`)."""
    s = cfg.serving
    if role == Role.INGRESS:
        # two (losing one fails only its own in-flight requests), each a small share of a CPU:
        # they tokenize and wait on the model replicas
        return {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.05}}
    gpus = {Role.ENGINE: s.verifier_num_gpus, Role.DRAFTER: s.drafter_num_gpus,
            Role.VERIFIER: s.verifier_num_gpus}[Role(role)]
    replicas = {Role.ENGINE: s.verifier_replicas, Role.DRAFTER: s.drafter_replicas,
                Role.VERIFIER: s.verifier_replicas}[Role(role)]
    return {"num_replicas": replicas,
            "ray_actor_options": {"num_cpus": s.replica_num_cpus, "num_gpus": gpus}}
