"""The typed items a batched split call carries, one per request (plain data: they cross Ray
hops pickled). Each carries the committed tokens, the ingress's truth, so any replica can
rebuild a request it does not hold; replies stay plain dicts (see `ReplicaDecoder`)."""

from __future__ import annotations

from dataclasses import dataclass

from peftbd.serving.features import FeatureBlock


@dataclass(frozen=True)
class PrefillItem:
    """Start a request of `method` on the verifier: its prompt's forward commits one token."""

    session_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    method: str = "ar"


@dataclass(frozen=True)
class ProposeItem:
    """Draft the next block after `committed`; `features`: the verifier features of the last
    prefill / verify reply (the block-diffusion head), else None."""

    session_id: str
    committed: list[int]
    prompt_len: int
    max_new_tokens: int
    method: str
    features: FeatureBlock | None = None


@dataclass(frozen=True)
class VerifyItem:
    """Verify `draft` after `committed` (an empty draft: one greedy AR step)."""

    session_id: str
    committed: list[int]
    prompt_len: int
    max_new_tokens: int
    draft: list[int]
    method: str = "ar"
