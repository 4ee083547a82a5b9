"""The config tree's serving section (`ServingConfig`: Ray Serve's apps and the placement
experiment) and the allowed values of its enum-like fields; `peftbd.config_sections` re-exports
them with the other sections (the presets hold every value, see there)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from peftbd.config_rules import (
    DISTINCT,
    Fraction,
    MethodTokens,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
)

Method = str  # a method id of peftbd.methods: peftbd.serving.validation.check_serving_config
DrafterSync = Literal["ship", "forward"]  # peftbd.methods.Method.ships
Placement = Literal[  # jobs.placement_options.placement_options
    "colocated", "split", "split-forward", "split-ahead", "split-cross-node", "split-same-node",
    "split-fractional-gpu",
]


@dataclass(frozen=True)
class ServingConfig:
    """Ray Serve: the served model name, request limits, per-request state and placement."""

    model_name: str  # GET /v1/models lists it and "<model_name>:<method>"
    default_method: Method  # when the request names none
    max_prompt_tokens: PositiveInt
    max_tokens_cap: PositiveInt  # also the default max_tokens
    max_body_bytes: PositiveInt
    max_sessions: PositiveInt  # per-request KV states a replica keeps (least recently used go)
    max_batch: PositiveInt  # requests one replica steps together per method (one batched call)
    batch_wait_ms: NonNegativeFloat  # how long a batch that is not full waits for more requests
    # split: the Verifier deals its requests into this many groups, each stepped in turn by a
    # thread of its own; with 2+ the Drafter drafts one group while the Verifier verifies
    # another (1: every request in lockstep)
    split_groups: PositiveInt
    # split: how a Drafter catches a request up with what the Verifier committed. ship: the
    # Verifier sends the state the drafter reads (PEFT-BD: the KV of the positions it cached;
    # FastMTP: their final hidden states); forward: the Drafter runs its own verifier forward
    # over them. The block-diffusion head always takes the Verifier's features.
    drafter_sync: DrafterSync
    round_retries: NonNegativeInt  # a round whose replica died is retried this often elsewhere
    recovery_timeout_s: NonNegativeFloat  # how long a retried round waits for a live replica
    replica_num_cpus: NonNegativeFloat
    drafter_replicas: PositiveInt
    verifier_replicas: PositiveInt
    drafter_num_gpus: NonNegativeFloat
    verifier_num_gpus: NonNegativeFloat  # also the colocated engine's
    placements: tuple[Placement, ...]  # run by jobs/placement.py
    placement_methods: tuple[Method, ...]  # ditto
    # jobs/placement.py: requests in flight, each level in turn
    client_concurrency: Annotated[tuple[PositiveInt, ...], DISTINCT]
    # jobs/placement.py: requests per level: 0 = every prompt x decoding.repeats; n = max(n,
    # clients) of them, cycling over the prompts (one request per client at least)
    level_requests: NonNegativeInt
    # jobs/placement.py: capacity = the most clients that each still get >= this share of one
    # client's tok/s
    capacity_fraction: Fraction
    # Controlled ("synthetic") acceptance in both apps: each "method=tokens" entry serves that
    # method's real drafts forced to `tokens` accepted tokens per round (decoding.synthetic_seed;
    # oracle: the replica's own greedy AR output of the prompt); labelled synthetic in usage and
    # metrics. Empty: every method's own acceptance.
    synthetic: tuple[MethodTokens, ...]
    # split: while a round verifies, the idle Drafter drafts the next one for its likeliest
    # outcome (peftbd.decoding.ahead); the placement "split-ahead" runs it at `ahead_levels`
    draft_ahead: bool
    ahead_levels: tuple[PositiveInt, ...]
