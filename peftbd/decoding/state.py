"""Per-request decoding state and per-round records: everything a server holds between rounds."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from peftbd.decoding.clock import ForwardLog
from peftbd.decoding.fast_path import EAGER, ForwardPath
from peftbd.decoding.ragged import RowCache
from peftbd.decoding.sampling import GREEDY, SamplingParams

T = TypeVar("T")


@dataclass
class RoundMetrics:
    """One speculative round (draft + verify).

    proposed: drafted tokens sent to verification (k). accepted: the longest prefix of the draft
    that the verifier accepted (0..k; greedy: equal to its argmax tokens, sampled: passed the
    rejection rule of `peftbd.decoding.sampling`) and is in the output: a round whose output
    ends at an EOS or `max_new_tokens` inside that prefix counts it up to there (EOS included,
    nothing after it); the verifier's bonus token is NOT counted. emitted: tokens appended to the
    output this round = accepted + 1 (the bonus), or = accepted when the output ended inside the
    draft (`ended_in_draft`). The paper's "accepted tokens
    per speculative step" is the mean of `emitted`. draft_ms / verify_ms: the propose / verify
    calls (batched: the whole calls, which every row of the batch waited for); other_ms: from the
    end of the row's previous round (or prefill) to this round's propose.
    """

    proposed: int
    accepted: int
    emitted: int
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    other_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.other_ms

    @property
    def ended_in_draft(self) -> bool:
        """The output ended (EOS or budget) at an accepted draft token: no bonus, and the draft
        positions after it were never judged."""
        return self.emitted == self.accepted and self.proposed > 0


@dataclass
class DecodeState:
    """One request. Invariant between rounds: `cache` (its row of a `RaggedKV`) holds the
    verifier's (adapter-off) KV of `tokens[:-1]`; the last committed token (the bonus) is not in
    it yet. The engine steps any number of states at once (`peftbd.decoding.ragged.pack` packs
    them); each keeps its own cache.

    `hidden` holds the verifier's final hidden states (1, n, d) of the positions that predicted
    the last n committed tokens (set by prefill and by every verify; drafters such as FastMTP read
    it). `features` (1, n, m*d), when `feature_layers` names m verifier hidden states (indices
    into transformers' `hidden_states`), holds them concatenated for the same n positions (the
    block-diffusion head reads them). `drafter_state` is the drafter's own per-request state (the
    MTP head's and the block-diffusion head's KV cache, `drafter_cache`; a split Verifier's
    remote drafter's session; None for a drafter that keeps none), set by its `start`.
    `sampling`: how the verifier picks tokens (greedy, or sampled with a seed:
    `peftbd.decoding.sampling`). `path`: the path its forwards run on, the verifier's and the
    drafter's (`peftbd.decoding.fast_path`: eager, or its decoder's compiled graphs).
    """

    tokens: list[int]
    prompt_len: int
    max_new_tokens: int
    eos_ids: frozenset[int]
    cache: RowCache
    forwards: ForwardLog
    device: torch.device
    hidden: torch.Tensor | None = None
    feature_layers: tuple[int, ...] = ()
    features: torch.Tensor | None = None
    done: bool = False
    rounds: list[RoundMetrics] = field(default_factory=list)
    prefill_s: float = 0.0
    mark: float = 0.0  # clock reading at the end of the last prefill/round (for `other_ms`)
    drafter_state: object = None
    sampling: SamplingParams = GREEDY
    path: ForwardPath = EAGER

    @property
    def new_tokens(self) -> list[int]:
        """The generated tokens (EOS included when the output stopped on it)."""
        return self.tokens[self.prompt_len :]

    @property
    def remaining(self) -> int:
        """How many more tokens may be generated."""
        return self.max_new_tokens - len(self.new_tokens)


def all_feature_layers(num_hidden_layers: int) -> tuple[int, ...]:
    """Every index into transformers' `hidden_states` of a model this deep (the embeddings' and
    each layer's output): a prefill keeping them all can start a request for any drafter
    (`with_feature_layers`)."""
    return tuple(range(num_hidden_layers + 1))


def with_feature_layers(state: DecodeState, layers: Sequence[int]) -> DecodeState:
    """`state`, prefilled keeping at least `layers`' features, as a prefill keeping exactly
    `layers` (in that order) leaves it: one prefill serves drafters that read different features
    (the forward is the same; only what it keeps differs). A shallow copy: its cache and tensors
    are `state`'s, so copy it before stepping."""
    layers = tuple(layers)
    missing = set(layers) - set(state.feature_layers)
    if missing:
        raise ValueError(f"the state keeps features of layers {state.feature_layers}, not of "
                         f"{sorted(missing)}; prefill it with feature_layers covering them")
    features = None
    if layers and state.features is not None:
        parts = state.features.chunk(len(state.feature_layers), -1)
        features = torch.cat([parts[state.feature_layers.index(k)] for k in layers], -1)
    return dataclasses.replace(state, feature_layers=layers, features=features)


def timed(states: Sequence[DecodeState], mode: str) -> contextlib.AbstractContextManager[None]:
    """Time one (batched) forward of `mode` over `states`: it counts, whole, for every row."""
    return states[0].forwards.timed(mode, *(s.forwards for s in states[1:]))


def drafter_cache(state: DecodeState, what: str) -> RowCache:
    """The drafter's own KV cache of `state` (a head's, set by its `start`); a clear error
    naming `what` when it has none."""
    cache = present(state.drafter_state, what)
    if not isinstance(cache, RowCache):
        raise TypeError(f"{what} is a {type(cache).__name__}, not a RowCache: a state started by "
                        "another drafter")
    return cache


def present(value: T | None, what: str) -> T:
    """`value`, which the round protocol has set (e.g. `state.hidden` after a verify); a clear
    error naming `what` when it has not."""
    if value is None:
        raise RuntimeError(f"{what} is not set: start the request with SpeculativeDecoder.start "
                           "and call propose once per verify")
    return value
