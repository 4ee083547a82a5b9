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
from peftbd.training.examples import SequenceBatch, collate_sequences
from peftbd.training.head_objective import head_drafts
from peftbd.training.mtp_objective import mtp_drafts
from peftbd.training.rounds import Drafts, peftbd_drafts, replay_rounds

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
    """True when `spec`'s drafter has a replay (every one-step drafter)."""
    return spec.method in ("fastmtp", "peftbd_head") or (
        spec.method == "peftbd" and (spec.denoise_steps or 1) == 1)


def arm_drafts(models: ArmModels, spec: ArmSpec, batch: SequenceBatch) -> tuple[Drafts, int]:
    """`spec`'s drafts of `batch`'s replayed rounds and the tokens a round proposes at most."""
    if spec.method == "peftbd":
        return peftbd_drafts(models.verifier_for(spec), batch, block_size=models.block_size,
                             mask_id=models.mask_id, pad_id=models.pad_id,
                             anchored=bool(spec.anchored)), models.block_size
    if spec.method == "fastmtp":
        k = spec.mtp_steps or 1
        return mtp_drafts(models.mtp_head, models.verifier, batch, k), k
    if spec.method == "peftbd_head" and models.bd_head is not None:
        vocab = None
        if spec.draft_vocab:
            ids = torch.tensor((models.draft_vocab or [])[: spec.draft_vocab])
            vocab = models.bd_head.draft_vocabulary(ids)
        return head_drafts(models.bd_head, models.verifier, batch, block_size=models.block_size,
                           pad_id=models.pad_id, vocab=vocab), models.block_size
    raise ValueError(f"arm {spec.id!r} ({spec.method}, {spec.denoise_steps} steps) has no replay")


@torch.no_grad()
def replay_arms(models: ArmModels, specs: Sequence[ArmSpec], prompts: Sequence[Prompt],
                references: Sequence[Sequence[int]], budget: int) -> dict[str, ReplaySums]:
    """{arm id: its replayed rounds' sums} for every arm that `replays`, over `prompts` whose
    greedy outputs (EOS included when they stopped on one) are `references`, at `budget` new
    tokens (the benchmark's `decoding.max_new_tokens`)."""
    out: dict[str, ReplaySums] = {}
    for spec in (s for s in specs if replays(s)):
        total = ReplaySums()
        for i in range(0, len(prompts), REPLAY_ROWS):
            part = range(i, min(i + REPLAY_ROWS, len(prompts)))
            rows = {"id": [prompts[j].id for j in part],
                    "prompt_ids": [prompts[j].prompt_ids for j in part],
                    "continuation_ids": [list(references[j]) for j in part],
                    "prompt_len": [len(prompts[j].prompt_ids) for j in part]}
            batch = collate_sequences(rows, models.pad_id).to(models.device)
            drafts, width = arm_drafts(models, spec, batch)
            for row in replay_rounds(drafts, batch, budget=budget, block_size=width):
                total += ReplaySums(len(row), sum(x.proposed for x in row),
                                    sum(x.accepted for x in row))
        out[spec.id] = total
    return out
