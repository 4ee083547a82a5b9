"""The offline estimate on the benchmark's own prompts: each drafter's rounds replayed
(`peftbd.training.rounds`) over prompt + greedy AR's output at the benchmark's budget.

Training estimates the accepted prefix on its val rows at `data.max_new_tokens`; the engine
decodes the test prompts at `decoding.max_new_tokens`. Replaying the engine's rounds on exactly
the benchmark's prompts and budget separates the two questions Table 6 asks: does the engine
accept what the drafter drafts (engine vs this replay: float noise only), and does training's
estimate carry over to other rows and budgets (training vs this replay). Arms with a one-step
drafter replay: PEFT-BD (anchored or not, any adapter), FastMTP and the block-diffusion head
(with its draft vocabulary); the two-step arm has no replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from peftbd.benchmarking.arms import ArmModels, ArmSpec
from peftbd.benchmarking.prompts import Prompt
from peftbd.decoding import BDHeadDrafter, Drafter, MTPDrafter, PeftBDDrafter
from peftbd.training.examples import SequenceBatch, collate_sequences
from peftbd.training.head_objective import head_drafts
from peftbd.training.mtp_objective import mtp_drafts
from peftbd.training.rounds import Drafts, peftbd_drafts, replay_rounds, round_sums

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

    def to_dict(self) -> dict[str, float | int | None]:
        """results.json's `replay` entry of an arm."""
        return {"rounds": self.rounds, "proposed": self.proposed, "accepted": self.accepted,
                "mean_accepted_prefix": self.accepted / self.rounds if self.rounds else None,
                "token_acceptance": self.accepted / self.proposed if self.proposed else None}


def replays(spec: ArmSpec) -> bool:
    """True when `spec`'s drafter has a replay (every one-step drafter; a synthetic arm's
    acceptance is its profile's, nothing to estimate)."""
    return spec.synthetic is None and (spec.method in ("fastmtp", "peftbd_head") or (
        spec.method == "peftbd" and (spec.denoise_steps or 1) == 1))


def arm_drafts(models: ArmModels, drafter: Drafter, batch: SequenceBatch) -> tuple[Drafts, int]:
    """The engine `drafter`'s drafts of `batch`'s replayed rounds, with its own model and settings
    (adapter, anchoring, MTP steps, draft vocabulary), and the tokens a round proposes at most."""
    if isinstance(drafter, PeftBDDrafter):
        return peftbd_drafts(drafter.model, batch, block_size=drafter.block_size,
                             mask_id=drafter.mask_id, pad_id=models.pad_id,
                             anchored=drafter.anchored), drafter.block_size
    if isinstance(drafter, MTPDrafter):
        return mtp_drafts(drafter.head, models.verifier, batch, drafter.num_steps), drafter.num_steps
    if isinstance(drafter, BDHeadDrafter):
        return head_drafts(drafter.head, models.verifier, batch, block_size=drafter.block_size,
                           pad_id=models.pad_id, vocab=drafter.vocab), drafter.block_size
    raise ValueError(f"drafter {type(drafter).__name__} has no replay")


@torch.no_grad()
def replay_arms(models: ArmModels, specs: Sequence[ArmSpec], prompts: Sequence[Prompt],
                references: Sequence[Sequence[int]], budget: int) -> dict[str, ReplaySums]:
    """{arm id: its replayed rounds' sums} for every arm that `replays`, over `prompts` whose
    greedy outputs (EOS included when they stopped on one) are `references`, at `budget` new
    tokens (the benchmark's `decoding.max_new_tokens`)."""
    out: dict[str, ReplaySums] = {}
    for spec in (s for s in specs if replays(s)):
        drafter, total = models.drafter_for(spec), ReplaySums()
        for i in range(0, len(prompts), REPLAY_ROWS):
            part = range(i, min(i + REPLAY_ROWS, len(prompts)))
            rows = {"id": [prompts[j].id for j in part],
                    "prompt_ids": [prompts[j].prompt_ids for j in part],
                    "continuation_ids": [list(references[j]) for j in part],
                    "prompt_len": [len(prompts[j].prompt_ids) for j in part]}
            batch = collate_sequences(rows, models.pad_id).to(models.device)
            drafts, width = arm_drafts(models, drafter, batch)
            sums = round_sums(replay_rounds(drafts, batch, budget=budget, block_size=width))
            total += ReplaySums(int(sums["rounds"]), int(sums["round_proposed"]),
                                int(sums["round_accepted"]))
        out[spec.id] = total
    return out
