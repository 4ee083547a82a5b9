"""Controlled ("synthetic") acceptance: a drafter's real forwards at a chosen acceptance.

`ControlledDrafter` wraps any drafter. Each round it runs the drafter's own `propose` (so every
draft forward, and its cost, is real), then rewrites the block: how many leading positions match
is drawn from an `AcceptanceProfile`, those positions take the verifier's own greedy tokens (the
`oracle`: greedy AR's output for the request), and the first position after them takes a token
the verifier will reject. Verification stays real, so the output is greedy AR's exactly (the
audit checks it) and the accepted length is the profile's. vLLM calls the equivalent mode
"synthetic acceptance"; everything measured with it is labelled synthetic.

Drafting ahead (`propose_ahead`, `peftbd.decoding.ahead`) is scripted the same way: the inner
drafter's pre-draft forward is real, and the pre-draft accepts as the round it stands for would
have.

A request's draws depend only on the seed, its prompt and how many tokens it has generated, so a
request accepts the same way at any batch size and in any batch company.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import OrderedDict
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from peftbd.decoding.ahead import PreDraft
from peftbd.decoding.drafter import Drafter, draft_forward, draft_on_path
from peftbd.decoding.scheduler import Request
from peftbd.decoding.state import DecodeState

Oracle = Callable[[DecodeState], Sequence[int]]
"""The verifier's greedy continuation of a state's committed tokens (what it will accept)."""


@dataclass(frozen=True)
class AcceptanceProfile:
    """P(draft position j is accepted | positions 1..j-1 were), for j = 1..len(conditional);
    positions past the end are never accepted. `describe` is how reports name it."""

    conditional: tuple[float, ...]
    describe: str

    def __post_init__(self) -> None:
        if not self.conditional or any(not 0.0 <= c <= 1.0 for c in self.conditional):
            raise ValueError(f"an acceptance profile needs rates in [0, 1]; got {self.conditional}")

    @classmethod
    def geometric(cls, gamma: float, positions: int) -> AcceptanceProfile:
        """Every position accepted with probability `gamma` given the ones before (P(j
        accepted) = gamma^j), as vLLM's synthetic acceptance rate."""
        return cls((gamma,) * positions, f"geometric, gamma {gamma:.3f}")

    @classmethod
    def with_mean(cls, mean_emitted: float, positions: int) -> AcceptanceProfile:
        """The geometric profile whose rounds emit `mean_emitted` tokens on average (accepted
        draft tokens + the bonus, the paper's "accepted tokens per step") over `positions`."""
        if not 1.0 <= mean_emitted <= positions + 1:
            raise ValueError(f"a mean of {mean_emitted} tokens per round is out of reach with "
                             f"{positions} draft positions; use 1 .. {positions + 1}")
        low, high = 0.0, 1.0
        for _ in range(60):  # bisection: expected_emitted grows with gamma
            mid = (low + high) / 2
            if cls.geometric(mid, positions).expected_emitted() < mean_emitted:
                low = mid
            else:
                high = mid
        gamma = (low + high) / 2
        return cls((gamma,) * positions, f"mean {mean_emitted:g} tokens/round, geometric "
                   f"(gamma {gamma:.3f}) over {positions} positions")

    @classmethod
    def measured(cls, conditional: Sequence[float | None], source: str) -> AcceptanceProfile:
        """A profile measured elsewhere (results.json `per_position.conditional`); a position no
        round reached (None) accepts nothing."""
        rates = tuple(0.0 if c is None else float(c) for c in conditional)
        return cls(rates, f"measured per position ({source})")

    def expected_emitted(self, positions: int | None = None) -> float:
        """Mean tokens a round emits with `positions` drafted (default: all): 1 + sum_j P(j)."""
        total, reach = 1.0, 1.0
        for c in self.conditional[: len(self.conditional) if positions is None else positions]:
            reach *= c
            total += reach
        return total

    def draw(self, positions: int, rng: random.Random) -> int:
        """How many leading positions of a `positions`-long draft are accepted."""
        accepted = 0
        for c in self.conditional[:positions]:
            if rng.random() >= c:
                break
            accepted += 1
        return accepted


def request_rng(seed: int, state: Request, ahead: int = 0) -> random.Random:
    """The draws of one round of one request: a function of the seed, the prompt and how many
    tokens it has generated (`ahead` more for a round drafted ahead: the same draws as when that
    round comes), nothing else."""
    key = hashlib.blake2b(digest_size=8)
    key.update(seed.to_bytes(8, "little", signed=True))
    key.update((len(state.new_tokens) + ahead).to_bytes(8, "little"))
    key.update(array("q", state.tokens[: state.prompt_len]).tobytes())
    return random.Random(int.from_bytes(key.digest(), "little"))


def rejected(token: int) -> int:
    """A token other than `token` (the verifier's choice), so the position is rejected."""
    return token - 1 if token > 0 else token + 1


class ControlledDrafter:
    """`inner` drafts (its forwards are real), `profile` decides how much of it matches."""

    def __init__(self, inner: Drafter, profile: AcceptanceProfile, oracle: Oracle,
                 seed: int = 0) -> None:
        self.inner, self.profile, self.oracle, self.seed = inner, profile, oracle, seed
        self.name = f"{inner.name} [synthetic: {profile.describe}]"
        self.reads_kv_layers = inner.reads_kv_layers
        self.reads_hidden = inner.reads_hidden
        self.feature_layers = inner.feature_layers
        self.draft_forward = draft_forward(inner)
        self.draft_on_path = draft_on_path(inner)

    def start(self, state: DecodeState) -> None:
        if not state.sampling.greedy:
            raise ValueError(
                f"{self.name} is controlled acceptance, which forces drafts to greedy AR's tokens: "
                "it needs temperature 0 (a sampled request's tokens are not greedy AR's, and its "
                "acceptance is drawn by the lossless rule, not by the profile)")
        self.inner.start(state)

    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        drafts = self.inner.propose(states, max_tokens)
        return [self._scripted(d, self.oracle(s), request_rng(self.seed, s))
                for s, d in zip(states, drafts)]

    def propose_ahead(self, states: Sequence[DecodeState], drafts: Sequence[Sequence[int]],
                      accepted: Sequence[int], max_tokens: Sequence[int]) -> list[PreDraft]:
        """The inner drafter's pre-drafts (`peftbd.decoding.ahead`: its forwards are real),
        scripted: each accepts as the profile draws for the round it stands for (the draws that
        round gets when drafted ordinarily; `jobs.ahead_study` measures no acceptance lost to
        drafting ahead on the tiny world's trained PEFT-BD)."""
        pre = self.inner.propose_ahead(states, drafts, accepted, max_tokens)  # type: ignore[attr-defined]
        return [self._scripted_ahead(s, p) for s, p in zip(states, pre)]

    def _scripted_ahead(self, state: DecodeState, pre: PreDraft) -> PreDraft:
        greedy, k = self.oracle(state), pre.accepted
        if k >= len(greedy):  # the output ends inside the guessed tokens: no next round
            return pre
        return PreDraft(k, self._scripted(pre.draft, greedy[k + 1:],
                                          request_rng(self.seed, state, ahead=k + 1)))

    def _scripted(self, draft: torch.Tensor, continuation: Sequence[int],
                  rng: random.Random) -> torch.Tensor:
        """`draft` matching the verifier's greedy `continuation` for as many leading positions as
        the profile draws from `rng`, then rejected."""
        k = draft.shape[-1]
        if k == 0:
            return draft
        greedy = list(continuation[:k])
        accepted = min(self.profile.draw(k, rng), len(greedy))
        tokens = draft.reshape(-1).tolist()
        tokens[:accepted] = greedy[:accepted]
        if accepted < len(greedy):
            tokens[accepted] = rejected(greedy[accepted])
        return torch.tensor([tokens], dtype=draft.dtype, device=draft.device)


class GreedyOracle:
    """The oracle of a server, whose prompts are not known in advance: a prompt's greedy AR
    output comes from `references` ({prompt ids: output}, e.g. precomputed by the placement job)
    or, the first time the prompt is seen, from `ar(prompt, budget)` (greedy AR over the same
    verifier, adapter off; budget: `max_new_tokens`, or the request's if larger), then kept (at most `capacity` prompts, least
    recently used go). `misses` / `miss_s` count those decodes: they run inside a draft call,
    so the round that pays one is slower than it would be with the output known."""

    def __init__(self, ar: Callable[[Sequence[int], int], Sequence[int]], max_new_tokens: int,
                 references: dict[tuple[int, ...], Sequence[int]] | None = None,
                 capacity: int = 4096) -> None:
        self.ar, self.max_new_tokens, self.capacity = ar, max_new_tokens, capacity
        self.outputs: OrderedDict[tuple[int, ...], list[int]] = OrderedDict(
            (tuple(p), list(o)) for p, o in (references or {}).items())
        self.misses, self.miss_s = 0, 0.0

    def __call__(self, state: DecodeState) -> Sequence[int]:
        prompt = tuple(state.tokens[: state.prompt_len])
        output = self.outputs.get(prompt)
        if output is None or len(output) < state.max_new_tokens and not _ended(output, state):
            start = time.perf_counter()
            output = list(self.ar(prompt, max(self.max_new_tokens, state.max_new_tokens)))
            self.misses, self.miss_s = self.misses + 1, self.miss_s + time.perf_counter() - start
        self.outputs[prompt] = output
        self.outputs.move_to_end(prompt)
        while len(self.outputs) > self.capacity:
            self.outputs.popitem(last=False)
        return output[len(state.new_tokens):]


def _ended(output: Sequence[int], state: DecodeState) -> bool:
    """A greedy output that stopped at an EOS: no budget makes it longer."""
    return bool(output) and output[-1] in state.eos_ids


def reference_oracle(references: Mapping[tuple[int, ...], Sequence[int]]) -> Oracle:
    """The oracle of requests whose greedy outputs are known: {prompt ids: greedy AR output}."""

    def oracle(state: DecodeState) -> Sequence[int]:
        prompt = tuple(state.tokens[: state.prompt_len])
        if prompt not in references:
            raise KeyError("controlled acceptance needs the greedy AR output of every prompt it "
                           "decodes; this prompt has none (decode it with AR first)")
        return references[prompt][len(state.new_tokens):]

    return oracle
