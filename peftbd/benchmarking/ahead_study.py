"""How well a drafter drafts ahead (`peftbd.decoding.ahead`), measured on real acceptance: how
often a split Verifier's guess (the request's likeliest accepted length) was the round's, and
what the pre-drafts of those rounds then accepted against the ordinary drafts of the same next
rounds (a pre-draft drafts without the bonus and with adapter-on KV of the guessed tokens, not
the verifier's: what that costs in acceptance, which controlled acceptance assumes is nothing).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from peftbd.decoding import SpeculativeDecoder
from peftbd.decoding.ahead import PreDraft, drafts_ahead, likeliest


@dataclass(frozen=True)
class GuessStudy:
    """Counts over every round that had a draft and a next round."""

    rounds: int
    hits: int  # the guessed accepted length was the round's: the pre-draft would be used
    accepted_pre: int  # over the hits: draft tokens the pre-draft accepted in the next round
    accepted_ordinary: int  # over the hits: draft tokens the ordinary draft accepted there

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.rounds if self.rounds else None


@torch.inference_mode()
def guess_study(decoder: SpeculativeDecoder, prompts: Sequence[Sequence[int]],
                max_new_tokens: int) -> GuessStudy:
    """Decode each prompt greedily, one request at a time, drafting each round ahead as the
    split Verifier's remote drafter does (module doc); the outputs are the decoder's own."""
    if not drafts_ahead(decoder.drafter):
        raise ValueError(f"{decoder.drafter.name} cannot draft ahead (it has no propose_ahead)")
    rounds = hits = accepted_pre = accepted_ordinary = 0
    for prompt in prompts:
        state, history = decoder.start(prompt, max_new_tokens), list[int]()
        used: PreDraft | None = None  # the last round's pre-draft, its guess right
        while not state.done:
            draft = decoder.propose(state)[0].tolist()
            mine = None if used is None else decoder.verify(copy.deepcopy(state), used.draft).accepted
            guess = likeliest(history, len(draft))
            pre = decoder.drafter.propose_ahead(  # type: ignore[attr-defined]
                [state], [draft], [guess], [state.remaining - guess - 2])[0]
            result = decoder.verify(state, draft)
            if mine is not None:
                accepted_pre, accepted_ordinary = accepted_pre + mine, accepted_ordinary + result.accepted
            history.append(result.accepted)
            used = None
            if state.done or not draft:
                continue
            rounds += 1
            if result.accepted == guess:
                hits, used = hits + 1, pre
    return GuessStudy(rounds, hits, accepted_pre, accepted_ordinary)
