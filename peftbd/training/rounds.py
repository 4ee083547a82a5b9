"""The offline estimate of the engine's block-drafter rounds (PEFT-BD, the block-diffusion
head): greedy speculative decoding replayed on artifact rows.

A row's continuation y_P..y_{n-1} is the verifier's greedy output (stopped at EOS or after
`budget` tokens), so greedy verification of a draft accepts exactly its longest prefix that
matches the continuation, and what the engine commits is the continuation itself. The replay
runs the rounds of `SpeculativeDecoder` with a one-step block drafter and a budget
of `budget` new tokens: prefill commits y_P; a round at position c (y_0..y_{c-1} committed)
drafts against the clean KV of y_0..y_{c-2} with the chunk `[y_{c-1}, masks]` (the training
chunk at t = 1), proposes k = min(D, budget - (c - P) - 1) tokens (the engine's cap: the
remaining budget - 1), accepts the longest prefix a matching y_c..y_{n-1} and moves to
c + a + 1 (accepted + bonus); rounds go on while c < n. A row that ended on EOS before the budget
can so draft its EOS, as the engine does.

All rows of a batch draft together, one forward per round against one clean context computed
once (a finished row's chunk is a dummy): `Drafts` is that forward, `peftbd_drafts` PEFT-BD's
(the clean KV), `peftbd.training.head_objective.head_drafts` the head's (the context KV). What can still differ from the engine: float noise of batched
vs incremental KV (an argmax near-tie may flip). Drafted tokens past an EOS count as accepted in
neither (the engine counts up to the committed output, EOS included).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from peft import PeftModel

from peftbd.intervals import ratio_interval
from peftbd.models.peft_bd import adapted_logits
from peftbd.training.block_diffusion import (
    DraftBatch,
    build_draft_batch,
    chunk_hidden_states,
    clean_cache,
)
from peftbd.training.examples import SequenceBatch


@dataclass(frozen=True)
class Round:
    """One replayed round: `proposed` draft tokens, of which the first `accepted` match."""

    proposed: int
    accepted: int


Drafts = Callable[[list[list[int]]], torch.Tensor]
"""Each row's starts (one start, or none for a finished row) -> long (B, D) on the CPU: each
row's t = 1 draft from its start (anything for finished rows)."""


def round_draft_batch(batch: SequenceBatch, starts: list[list[int]], *, block_size: int,
                      mask_id: int, pad_id: int, anchored: bool, dtype: torch.dtype) -> DraftBatch:
    """The t = 1 chunks of one replayed round (the training layout, no noise to draw)."""
    return build_draft_batch(
        batch, starts, block_size=block_size, mask_id=mask_id, pad_id=pad_id, anchored=anchored,
        gamma=1.0, t_range=(1.0, 1.0), seed=0, epoch=0, dtype=dtype,
    ).to(batch.ids.device)


def peftbd_drafts(model: PeftModel, batch: SequenceBatch, *, block_size: int, mask_id: int,
                  pad_id: int, anchored: bool) -> Drafts:
    """PEFT-BD's one-step drafts of `batch`'s rows against their clean KV (computed once)."""
    cache = clean_cache(model, batch.ids)

    def drafts(starts: list[list[int]]) -> torch.Tensor:
        draft = round_draft_batch(batch, starts, block_size=block_size, mask_id=mask_id,
                                  pad_id=pad_id, anchored=anchored,
                                  dtype=next(model.parameters()).dtype)
        hidden = draft.block_view(chunk_hidden_states(model, draft, cache))[:, 0]
        # the adapter-on head without peft's per-call copy of the whole table (one per round)
        logits = adapted_logits(model.get_base_model(), hidden).float()
        logits[..., mask_id] = -math.inf  # as the engine: the mask token is never proposed
        return logits.argmax(-1).cpu()

    return drafts


@torch.no_grad()
def replay_rounds(drafts: Drafts, batch: SequenceBatch, *, budget: int,
                  block_size: int) -> list[list[Round]]:
    """Each row's rounds, in order (see module doc; a row longer than `budget` is replayed with
    its own length as the budget); `drafts` is built on `batch`."""
    ids, lengths, prompt_lens = batch.ids.cpu(), batch.lengths.tolist(), batch.prompt_lens.tolist()
    position = [p + 1 for p in prompt_lens]  # prefill committed y_P
    rounds: list[list[Round]] = [[] for _ in lengths]
    while any(c < n for c, n in zip(position, lengths)):
        starts = [[c] if c < n else [] for c, n in zip(position, lengths)]
        drafted = drafts(starts)
        for r, (c, n, p) in enumerate(zip(position, lengths, prompt_lens)):
            if c >= n:
                continue
            k = min(block_size, max(budget, n - p) - (c - p) - 1)
            known = min(k, n - c)  # drafted positions the continuation covers
            a = int((drafted[r, :known] == ids[r, c : c + known]).long().cumprod(0).sum())
            rounds[r].append(Round(proposed=k, accepted=a))
            position[r] = c + a + 1
    return rounds


def round_sums(rounds: list[list[Round]]) -> dict[str, torch.Tensor]:
    """`rounds`, `round_proposed` and `round_accepted` over every row: sums, so batches and
    workers add them up (`peftbd.training.evaluate`)."""
    flat = [x for row in rounds for x in row]

    def total(value: float) -> torch.Tensor:
        return torch.tensor(float(value), dtype=torch.float64)

    return {
        "rounds": total(len(flat)),
        "round_proposed": total(sum(x.proposed for x in flat)),
        "round_accepted": total(sum(x.accepted for x in flat)),
    }


def row_values(rounds: list[list[Round]]) -> torch.Tensor:
    """Long (n, 2): each row's accepted draft tokens and rounds, in the batch's order ((0, 0)
    for a row without a round). A task's eval sums carry it under `evaluate.ROWS`, which
    gathers the rows (not their sums) over batches and workers."""
    values = [(sum(x.accepted for x in row), len(row)) for row in rounds]
    return torch.tensor(values, dtype=torch.long).reshape(len(values), 2)


def accepted_prefix_ci95(rows: torch.Tensor) -> list[float] | None:
    """`eval_accepted_prefix_ci95`: the 95% interval of the accepted prefix Σa / Σr over the
    rows with a round (`row_values`; rows are the independent units, a row's rounds are not),
    by `peftbd.intervals.ratio_interval`, as [lo, hi]; None: too few rows for an interval."""
    kept = [(a, r) for a, r in rows.tolist() if r > 0]
    ci = ratio_interval([a for a, _ in kept], [r for _, r in kept]) if kept else None
    return None if ci is None else [float(ci[0]), float(ci[1])]
