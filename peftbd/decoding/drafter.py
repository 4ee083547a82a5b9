"""The one `Drafter` interface every speculative method implements, and greedy AR's empty drafter.

A drafter is shared by all requests (it holds models, never per-request data); what it needs
per request lives in `state.drafter_state`. `propose` drafts for a batch of requests at once (one
is the batch-1 engine): it may read each state's `tokens`, `cache` (the verifier's KV of
`tokens[:-1]`), `hidden` and `features`, packs the rows it runs with
`peftbd.decoding.ragged.pack`, and must leave each `state.cache` exactly as it found it. Time
each of its (batched) forwards with `peftbd.decoding.state.timed(states, "draft")`.
New drafters (layer skipping, draft-in-verify, DFlash-style heads) implement these two methods
and join the loop unchanged. A sampled request verifies a proposal as one-hot (q = 1 on each
proposed token, as argmax drafts are; `peftbd.decoding.sampling`): lossless whatever proposed it.
A drafter that scripts its acceptance against the verifier's greedy tokens (the controlled
drafter) does not hold that script for sampled requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from peftbd.decoding.state import DecodeState


class Drafter(Protocol):
    """Proposes a block of draft tokens for the verifier to check."""

    name: str
    kv_layers: int | None
    """Leading layers of the verifier KV that `propose` reads (a split drafter replica keeps only
    those in sync); None: every layer, and `state.hidden`; 0: none (it reads `state.features`)."""
    feature_layers: tuple[int, ...]
    """Verifier hidden states (indices into transformers' `hidden_states`) that `propose` reads
    from `state.features`; () for none."""

    def start(self, state: DecodeState) -> None:
        """Set up `state.drafter_state` for a new request (called once, right after prefill)."""

    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        """Per state, long (1, k) draft tokens continuing its `tokens`, 0 <= k <= max_tokens[i]."""


class NoDrafter:
    """Greedy AR: proposes nothing, so every round is one verifier step emitting one token."""

    name = "ar"
    kv_layers = None
    feature_layers = ()

    def start(self, state: DecodeState) -> None:
        state.drafter_state = None

    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        return [no_draft(s) for s in states]


def no_draft(state: DecodeState) -> torch.Tensor:
    """An empty (1, 0) draft."""
    return torch.empty(1, 0, dtype=torch.long, device=state.device)
