"""The offline estimate on the benchmark's own prompts: each drafter's rounds replayed
(`peftbd.training.rounds`) over prompt + greedy AR's output at the benchmark's budget.

Training estimates the accepted prefix on its val rows at `data.max_new_tokens`; the engine
decodes the test prompts at `decoding.max_new_tokens`. Replaying the engine's rounds on exactly
the benchmark's prompts and budget separates the two questions Table 6 asks: does the engine
accept what the drafter drafts (engine vs this replay: float noise only), and does training's
estimate carry over to other rows and budgets (training vs this replay). Arms whose method
declares a replay do (PEFT-BD's one-step arms, FastMTP, the heads); the two-step arm has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from peftbd.benchmarking.arms import ArmModels
from peftbd.benchmarking.prompts import Prompt
from peftbd.benchmarking.schema import Replay
from peftbd.decoding.state import present
from peftbd.methods import AR, ArmSpec, method
from peftbd.training.examples import collate_sequences
from peftbd.training.rounds import Round, replay_rounds

REPLAY_ROWS = 8
"""Prompts replayed together (one draft forward per round for all of them)."""


@dataclass(frozen=True)
class ReplaySums:
    """Replayed rounds, draft tokens proposed and accepted (bonus excluded); summable."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0

    def __add__(self, other: ReplaySums) -> ReplaySums:
        return ReplaySums(self.rounds + other.rounds, self.proposed + other.proposed,
                          self.accepted + other.accepted)

    def entry(self) -> Replay:
        """results.json's `replay` entry of an arm."""
        return Replay(rounds=self.rounds, proposed=self.proposed, accepted=self.accepted,
                      mean_accepted_prefix=self.accepted / self.rounds if self.rounds else None,
                      token_acceptance=self.accepted / self.proposed if self.proposed else None)


@dataclass(frozen=True)
class RowReplay:
    """One prompt's replayed rounds: how many, draft tokens proposed and accepted (bonus
    excluded), and the rounds whose first draft token was accepted (position-1 acceptance)."""

    rounds: int
    proposed: int
    accepted: int
    first_accepted: int

    @classmethod
    def of(cls, rounds: Sequence[Round]) -> RowReplay:
        return cls(len(rounds), sum(r.proposed for r in rounds), sum(r.accepted for r in rounds),
                   sum(r.accepted > 0 for r in rounds))


@torch.no_grad()
def replay_rows(models: ArmModels, spec: ArmSpec, prompts: Sequence[Prompt],
                references: Sequence[Sequence[int]], budget: int) -> list[RowReplay] | None:
    """Each prompt's replayed rounds for arm `spec` (None: its method or setting has no replay;
    a synthetic arm's acceptance is its profile's, nothing to estimate), over `prompts` whose
    greedy outputs (EOS included when they stopped on one) are `references`, at `budget` new
    tokens."""
    replay = None if spec.method == AR or spec.synthetic else method(spec.method).replay
    if replay is None:
        return None
    drafter, rows = present(models.drafter_for(spec), f"{spec.id}'s drafter"), []
    for i in range(0, len(prompts), REPLAY_ROWS):
        part = range(i, min(i + REPLAY_ROWS, len(prompts)))
        columns = {"id": [prompts[j].id for j in part],
                   "prompt_ids": [prompts[j].prompt_ids for j in part],
                   "continuation_ids": [list(references[j]) for j in part],
                   "prompt_len": [len(prompts[j].prompt_ids) for j in part]}
        batch = collate_sequences(columns, models.pad_id).to(models.device)
        found = replay(drafter, models.ctx, batch)
        if found is None:  # this setting has none (PEFT-BD's two steps)
            return None
        drafts, width = found
        rows += [RowReplay.of(r) for r in replay_rounds(drafts, batch, budget=budget, block_size=width)]
    return rows


def replay_arms(models: ArmModels, specs: Sequence[ArmSpec], prompts: Sequence[Prompt],
                references: Sequence[Sequence[int]], budget: int) -> dict[str, ReplaySums]:
    """{arm id: its replayed rounds' sums} for every arm with a replay (`replay_rows`)."""
    out: dict[str, ReplaySums] = {}
    for spec in specs:
        rows = replay_rows(models, spec, prompts, references, budget)
        if rows is not None:
            out[spec.id] = sum((ReplaySums(r.rounds, r.proposed, r.accepted) for r in rows),
                               ReplaySums())
    return out
