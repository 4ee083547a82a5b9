"""The one `Drafter` interface every speculative method implements, and greedy AR's empty drafter.

A drafter is shared by all requests (it holds models, never per-request data); what it needs
per request lives in `state.drafter_state`. `propose` drafts for a batch of requests at once (one
is the batch-1 engine): besides each state's `tokens` it reads what its three declarations say
(`reads_kv_layers` of `cache`, the verifier's KV of `tokens[:-1]`; `hidden` if `reads_hidden`;
`features` if `feature_layers`: a split drafter replica keeps only those in sync), packs the rows
it runs with `peftbd.decoding.ragged.pack`, and must leave each `state.cache` as it found it. Time
each of its (batched) forwards with `peftbd.decoding.state.timed(states, "draft")`.
New drafters (layer skipping, draft-in-verify, DFlash-style heads) implement these two methods
and join the loop unchanged. A sampled request verifies a proposal as one-hot (q = 1 on each
proposed token, as argmax drafts are; `peftbd.decoding.sampling`): lossless whatever proposed it.
A drafter that scripts its acceptance against the verifier's greedy tokens (the controlled
drafter) does not hold that script for sampled requests. A drafter whose `propose` runs no model
(prompt lookup) sets `draft_forward = False`: it has no draft forward to put on a path
(`draft_forward`, `SpeculativeDecoder.forward_paths`). One that runs every forward through
`state.path.run` (`peftbd.decoding.fast_path`) sets `draft_on_path = True`: its draft is then
compiled on the fast path, as the verify is (`draft_on_path`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from peftbd.decoding.state import DecodeState


class Drafter(Protocol):
    """Proposes a block of draft tokens for the verifier to check."""

    @property
    def name(self) -> str: ...

    @property
    def reads_kv_layers(self) -> int | None:
        """How many leading layers of the verifier KV (`state.cache`) `propose` reads, as a slice
        end: `layers[:reads_kv_layers]` (None: all of them, 0: none)."""

    @property
    def reads_hidden(self) -> bool:
        """Whether `propose` reads `state.hidden`, the verifier's final hidden states."""

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """Verifier hidden states (indices into transformers' `hidden_states`) that `propose`
        reads from `state.features`; () for none."""

    def start(self, state: DecodeState) -> None:
        """Set up `state.drafter_state` for a new request (called once, right after prefill)."""

    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        """Per state, long (1, k) draft tokens continuing its `tokens`, 0 <= k <= max_tokens[i]."""


class NoDrafter:
    """Greedy AR: proposes nothing, so every round is one verifier step emitting one token."""

    name = "ar"
    reads_kv_layers: int | None = 0
    reads_hidden = False
    feature_layers: tuple[int, ...] = ()
    draft_forward = False

    def start(self, state: DecodeState) -> None:
        state.drafter_state = None

    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        return [no_draft(s) for s in states]


def no_draft(state: DecodeState) -> torch.Tensor:
    """An empty (1, 0) draft."""
    return torch.empty(1, 0, dtype=torch.long, device=state.device)


def draft_forward(drafter: Drafter) -> bool:
    """Whether `drafter.propose` runs a model forward: its optional `draft_forward` attribute
    (True when absent; False: greedy AR, prompt lookup)."""
    return bool(getattr(drafter, "draft_forward", True))


def draft_on_path(drafter: Drafter) -> bool:
    """Whether `drafter.propose` runs every model forward through the rows' `state.path`
    (`peftbd.decoding.fast_path`: compiled on the fast path): its optional `draft_on_path`
    attribute (False when absent: its forwards run eager whatever the path)."""
    return bool(getattr(drafter, "draft_on_path", False))


def catch_up_layers(drafter: Drafter) -> int | None:
    """How many leading verifier layers a forward that catches a state up for `drafter` must run
    (`peftbd.decoding.verify.advance`): its KV layers when they are all it reads (an early-exit
    PEFT-BD drafter's k; 0 for one that reads no verifier state, prompt lookup: no forward at
    all), else every layer (None), which `hidden`, `features` and verifying need."""
    if drafter.reads_hidden or drafter.feature_layers or drafter.reads_kv_layers is None:
        return None
    return drafter.reads_kv_layers
