"""How well a drafter guesses ahead (`peftbd.decoding.ahead`), measured on real acceptance: the
round driver's guess (the request's likeliest accepted length, the drafter's bonus) against what
each round of a greedy decode really committed, and what a confirmed pre-draft then accepted
against the ordinary draft of the same round (its guessed tokens sit in its chunk with
adapter-on KV, not the verifier's).

`GuessStudy.bonus_given_length` is what `serving.ahead_bonus_hit` assumes for a synthetic method:
the share of rounds whose guessed bonus was the verifier's token, among the rounds whose guessed
accepted length was right (then the bonus is all that decides a hit).
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
    length_right: int  # the guessed accepted length was the round's
    hits: int  # ... and the guessed bonus the verifier's: the pre-draft would be used
    accepted_pre: int  # over the hits: draft tokens the pre-draft had accepted
    accepted_ordinary: int  # over the hits: draft tokens the ordinary draft accepted
    # over the rounds whose length was right but not the bonus: PEFT-BD's pre-draft never saw
    # its guessed bonus (a mask in its chunk), so it still continues the committed tokens; what
    # it would have accepted there, against the ordinary draft
    accepted_pre_length_only: int = 0
    accepted_ordinary_length_only: int = 0

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.rounds if self.rounds else None

    @property
    def length_rate(self) -> float | None:
        return self.length_right / self.rounds if self.rounds else None

    @property
    def bonus_given_length(self) -> float | None:
        return self.hits / self.length_right if self.length_right else None


@torch.inference_mode()
def guess_study(decoder: SpeculativeDecoder, prompts: Sequence[Sequence[int]],
                max_new_tokens: int) -> GuessStudy:
    """Decode each prompt greedily, one request at a time, guessing each round ahead as the
    round driver does (module doc); the outputs are the decoder's own."""
    if not drafts_ahead(decoder.drafter):
        raise ValueError(f"{decoder.drafter.name} cannot draft ahead (it has no propose_ahead)")
    counts = dict.fromkeys(("rounds", "length_right", "hits", "accepted_pre", "accepted_ordinary",
                            "accepted_pre_length_only", "accepted_ordinary_length_only"), 0)
    for prompt in prompts:
        state, history = decoder.start(prompt, max_new_tokens), list[int]()
        used: tuple[PreDraft, str] | None = None  # last round's pre-draft, which counts it fits
        while not state.done:
            draft = decoder.propose(state)[0].tolist()
            mine = None if used is None else decoder.verify(copy.deepcopy(state), used[0].draft).accepted
            guess = likeliest(history, len(draft))
            pre = decoder.drafter.propose_ahead(  # type: ignore[attr-defined]
                [state], [draft], [guess], [state.remaining - guess - 2])[0]
            result = decoder.verify(state, draft)
            if used is not None and mine is not None:  # the round before guessed this one
                counts["accepted_pre" + used[1]] += mine
                counts["accepted_ordinary" + used[1]] += result.accepted
            history.append(result.accepted)
            used = None
            if state.done or not draft:
                continue
            counts["rounds"] += 1
            if result.accepted == guess:
                counts["length_right"] += 1
                hit = pre.guessed(draft) == result.tokens
                counts["hits"] += hit
                used = (pre, "" if hit else "_length_only")
    return GuessStudy(**counts)
