"""The one decoding loop: prefill, then rounds of (drafter proposes, verifier verifies) until EOS
or the token budget. Greedy AR is the same loop with `NoDrafter`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from peftbd.decoding.drafter import Drafter, NoDrafter
from peftbd.decoding.metrics import DecodeResult
from peftbd.decoding.state import DecodeState, RoundMetrics
from peftbd.decoding.verify import VerifyResult, prefill, verify


class SpeculativeDecoder:
    """Greedy speculative decoding of one verifier with one drafter (None = greedy AR).

    `decode` runs whole requests. A server that holds a `DecodeState` per request can instead
    call `start`, then per round `propose` and `verify` (possibly in different processes, passing
    plain token lists; see `peftbd.decoding.verify.advance`), or `step` for both.
    """

    def __init__(self, model: torch.nn.Module, drafter: Drafter | None = None,
                 eos_ids: Sequence[int] = (), max_new_tokens: int = 256) -> None:
        self.model = model
        self.drafter: Drafter = drafter or NoDrafter()
        self.eos_ids = tuple(eos_ids)
        self.max_new_tokens = max_new_tokens

    def start(self, prompt_ids: Sequence[int], max_new_tokens: int | None = None) -> DecodeState:
        """Prefill a new request (commits its first token) and set up the drafter's state."""
        budget = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        state = prefill(self.model, prompt_ids, budget, self.eos_ids, self.drafter.feature_layers)
        self.drafter.start(state)
        return state

    def propose(self, state: DecodeState) -> torch.Tensor:
        """The drafter's block for the next round, never longer than the budget can use."""
        return self.drafter.propose(state, max(state.remaining - 1, 0))

    def verify(self, state: DecodeState, draft: Sequence[int] | torch.Tensor) -> VerifyResult:
        """Verify `draft` against the verifier and commit the accepted tokens into `state`."""
        return verify(self.model, state, draft)

    def step(self, state: DecodeState) -> RoundMetrics:
        """One timed round: propose, verify, record."""
        clock = state.forwards.clock
        t_draft = clock.now()
        draft = self.propose(state)
        t_verify = clock.now()
        result = self.verify(state, draft)
        t_end = clock.now()
        record = RoundMetrics(
            proposed=result.proposed, accepted=result.accepted, emitted=len(result.tokens),
            draft_ms=(t_verify - t_draft) * 1e3, verify_ms=(t_end - t_verify) * 1e3,
            other_ms=(t_draft - state.mark) * 1e3,  # since the previous round ended
        )
        state.rounds.append(record)
        state.mark = t_end
        return record

    @torch.inference_mode()
    def decode(self, prompt_ids: Sequence[int], max_new_tokens: int | None = None) -> DecodeResult:
        """Decode one request to EOS or the budget; exact greedy output plus per-round metrics."""
        state = self.start(prompt_ids, max_new_tokens)
        while not state.done:
            self.step(state)
        return result_of(state)


def result_of(state: DecodeState) -> DecodeResult:
    """The `DecodeResult` of a (finished) request state."""
    return DecodeResult(
        tokens=state.new_tokens, rounds=list(state.rounds), prefill_s=state.prefill_s,
        forward_calls=dict(state.forwards.calls), forward_seconds=dict(state.forwards.seconds),
    )


def decode(model: torch.nn.Module, prompt_ids: Sequence[int], drafter: Drafter | None = None,
           max_new_tokens: int = 256, eos_ids: Sequence[int] = ()) -> DecodeResult:
    """Greedy (speculative when `drafter` is given) decoding of one prompt."""
    return SpeculativeDecoder(model, drafter, eos_ids, max_new_tokens).decode(prompt_ids)
