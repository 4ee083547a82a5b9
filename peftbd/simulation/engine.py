"""A simulated engine: what the scheduler steps (`peftbd.decoding.scheduler.Engine`) with no
forward run. Each prefill chunk and round is priced by a `CostModel` and recorded as the `Use`s of
devices it makes (the step's caller advances the virtual clock by them); the tokens a round
accepts are drawn from an `AcceptanceProfile` (controlled acceptance, with the draws the real
`ControlledDrafter` makes: `request_rng`), so a simulated request accepts as a synthetic one.

A request's output length is its budget (`max_new_tokens`: the simulator passes the measured
completion tokens of its prompt, or the run's budget): the tokens themselves are placeholders.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from peftbd.decoding.ahead import likeliest
from peftbd.decoding.controlled import AcceptanceProfile, request_rng
from peftbd.decoding.packed import packed_chunks
from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.decoding.state import RoundMetrics
from peftbd.simulation.shapes import CostModel, ForwardShape

ENGINE, DRAFTER, VERIFIER = "engine", "drafter", "verifier"
"""The devices a simulated step uses: a colocated Engine's one, or a split pair's two."""


@dataclass(frozen=True)
class Use:
    """`ms` of a step's time: on `device` (its model busy), or a hop between devices (None: the
    caller waits, no device is busy). `kind` "ahead": start a pre-draft (`hop` out, then `ms` on
    the device) without waiting for it; "await": wait for the last one started to end, then its
    `hop` back."""

    device: str | None
    ms: float
    kind: Literal["hold", "ahead", "await"] = "hold"
    hop: float = 0.0


@dataclass(eq=False)
class SimState:
    """A simulated request (the scheduler's `Request`): its committed tokens (placeholders), how
    much of its prompt the verifier's KV holds (`prefilled`), and its rounds."""

    tokens: list[int]
    prompt_len: int
    max_new_tokens: int
    eos_ids: frozenset[int] = frozenset()
    done: bool = False
    prefilled: int = 0
    prefill_s: float = 0.0
    rounds: list[RoundMetrics] = field(default_factory=list)
    ahead: int | None = None  # a pre-draft in flight: the accepted length it guessed
    pre_drafted: int = 0  # rounds that took their pre-draft

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.new_tokens)


class SimulatedEngine:
    """The scheduler's engine for requests of `method` on simulated devices (see module doc).

    `positions`: the tokens the method drafts a round (0: AR, no draft); `profile`: its
    acceptance (None with AR); `split`: the draft runs on a Drafter device behind a hop, the
    rest on the Verifier (else all on one Engine); `ship_bytes_per_token`: verifier state a split
    Verifier sends its Drafter per committed token (`Method.ships`); `seed`: the draws';
    `may_ahead`: a split Drafter drafts each round's next round during its verify while this
    says so (the step loop's `solo`), as `peftbd.serving.remote_drafter` does (None: never)."""

    def __init__(self, method: str, positions: int, profile: AcceptanceProfile | None,
                 cost: CostModel, prefill_chunk: int, split: bool = False,
                 ship_bytes_per_token: int = 0, seed: int = 0,
                 may_ahead: Callable[[], bool] | None = None) -> None:
        if positions and profile is None:
            raise ValueError(f"{method} drafts {positions} positions a round; give its acceptance profile")
        self.method, self.positions, self.profile, self.cost = method, positions, profile, cost
        self.prefill_chunk, self.split, self.seed = prefill_chunk, split, seed
        self.ship_bytes_per_token, self.may_ahead = ship_bytes_per_token, may_ahead
        self.uses: list[Use] = []

    def take_uses(self) -> list[Use]:
        """The device uses of what ran since the last call (in order)."""
        uses, self.uses = self.uses, []
        return uses

    def admit(self, tokens: Sequence[int], max_new_tokens: int,
              sampling: SamplingParams = GREEDY) -> SimState:
        if not sampling.greedy:
            raise ValueError("the simulator draws acceptance as controlled acceptance does: greedy only")
        return SimState(list(tokens), len(tokens), max_new_tokens, done=max_new_tokens == 0)

    def prefill(self, states: Sequence[SimState]) -> list[SimState]:
        segments = next(packed_chunks([len(s.tokens) for s in states], self.prefill_chunk,
                                      [s.prefilled for s in states]))
        rows = {seg.request for seg in segments}
        shape = ForwardShape("prefill", self.method, len(rows), sum(seg.tokens for seg in segments),
                             sum(seg.start for seg in segments))
        ms = self.cost.forward_ms(shape)
        self.uses.append(Use(VERIFIER if self.split else ENGINE, ms))
        done = []
        for seg in segments:
            state = states[seg.request]
            state.prefilled = seg.end
            state.prefill_s += ms / 1e3
            if seg.end == len(state.tokens):
                state.tokens.append(0)  # its first token
                state.done = state.remaining <= 0
                done.append(state)
        return done

    def step_many(self, states: Sequence[SimState]) -> list[RoundMetrics]:
        ks = [min(self.positions, max(s.remaining - 1, 0)) for s in states]
        kv = sum(len(s.tokens) - 1 for s in states)  # the last token is not in the KV yet
        width = max(ks)
        draft_ms = self._draft_ms(len(states), width, kv)
        verify_ms = self.cost.forward_ms(ForwardShape("verify", self.method, len(states), width + 1, kv))
        if self.split and width:
            draft_ms = self._remote_draft(states, ks, width, kv)
            self.uses.append(Use(VERIFIER, verify_ms))
        else:
            self.uses.append(Use(VERIFIER if self.split else ENGINE, draft_ms + verify_ms))
        records = []
        for state, k in zip(states, ks):
            accepted = self.profile.draw(k, request_rng(self.seed, state)) if k and self.profile else 0
            emitted = accepted + 1
            state.tokens += [0] * emitted
            state.done = state.remaining <= 0
            record = RoundMetrics(k, accepted, emitted, draft_ms, verify_ms)
            state.rounds.append(record)
            records.append(record)
        return records

    def _draft_ms(self, rows: int, width: int, kv: int) -> float:
        return self.cost.forward_ms(ForwardShape("draft", self.method, rows, width, kv)) if width else 0.0

    def _remote_draft(self, states: Sequence[SimState], ks: Sequence[int], width: int, kv: int) -> float:
        """A split round's propose as `RemoteDrafter.propose` makes it: await the pre-draft in
        flight (its reply is awaited either way), call the Drafter for the rows whose guess
        missed (a hop, the draft, a hop), then, when the loop may, start the next round's
        pre-draft for the likeliest accepted length; the ms of the draft this round took."""
        hop = self.cost.hop_ms(self.ship_bytes_per_token * sum(map(_unshipped, states)))
        if any(s.ahead is not None for s in states):
            self.uses.append(Use(DRAFTER, 0.0, "await", hop / 2))
        hit = [s.ahead is not None and s.rounds[-1].accepted == s.ahead for s in states]
        calling = [s for s, h in zip(states, hit) if not h]
        draft_ms = self._draft_ms(len(states), width, kv)
        if calling:
            draft_ms = self._draft_ms(len(calling), width, sum(len(s.tokens) - 1 for s in calling))
            self.uses += [Use(None, hop / 2), Use(DRAFTER, draft_ms), Use(None, hop / 2)]
        for state, h in zip(states, hit):
            state.ahead, state.pre_drafted = None, state.pre_drafted + h
        if self.may_ahead is not None and self.may_ahead():
            rows = [(s, k) for s, k in zip(states, ks) if k]
            for state, k in rows:
                state.ahead = likeliest([r.accepted for r in state.rounds], k)
            self.uses.append(Use(DRAFTER, self._draft_ms(len(rows), width, kv), "ahead", hop / 2))
        return draft_ms

    def release(self, state: SimState) -> None:
        """Nothing to free: a simulated request holds no pool row."""


def _unshipped(state: SimState) -> int:
    """Tokens a split Verifier ships its Drafter the state of with this round's propose: those
    the last round committed (the first round: the prompt and its first token)."""
    return state.rounds[-1].emitted if state.rounds else len(state.tokens)
