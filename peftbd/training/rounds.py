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


Z95 = 1.959963984540054
"""The standard normal's 97.5% quantile: a two-sided 95% interval is the estimate ± Z95 sd."""

ROW_MOMENTS = ("rows", "row_accepted_sq", "row_rounds_sq", "row_accepted_rounds")
"""The per-row second moments `round_sums` adds (see `ratio_ci95`)."""


def round_sums(rounds: list[list[Round]]) -> dict[str, torch.Tensor]:
    """`rounds`, `round_proposed` and `round_accepted` over every row, and the per-row moments of
    the accepted prefix's interval (`ratio_ci95`): over the rows i with at least one round
    (r_i rounds, a_i accepted draft tokens), `rows` = n, `row_accepted_sq` = Σ a_i²,
    `row_rounds_sq` = Σ r_i², `row_accepted_rounds` = Σ a_i r_i. All are sums, so batches and
    workers add them up (`peftbd.training.evaluate`)."""
    flat = [x for row in rounds for x in row]
    per_row = [(sum(x.accepted for x in row), len(row)) for row in rounds if row]

    def total(value: float) -> torch.Tensor:
        return torch.tensor(float(value), dtype=torch.float64)

    return {
        "rounds": total(len(flat)),
        "round_proposed": total(sum(x.proposed for x in flat)),
        "round_accepted": total(sum(x.accepted for x in flat)),
        "rows": total(len(per_row)),
        "row_accepted_sq": total(sum(a * a for a, _ in per_row)),
        "row_rounds_sq": total(sum(r * r for _, r in per_row)),
        "row_accepted_rounds": total(sum(a * r for a, r in per_row)),
    }


def ratio_ci95(n: float, sum_a: float, sum_r: float, sum_aa: float, sum_rr: float,
               sum_ar: float) -> tuple[float, float] | None:
    """The 95% interval of the ratio estimator R = Σa / Σr over n rows (row i: a_i, r_i) by the
    delta method, rows drawn independently (rounds of one row are not: they are its cluster).

    Linearized, R - ρ ≈ (ā - ρ r̄) / r̄ with ā, r̄ the row means, so Var R ≈ Var(d) / (n r̄²)
    with d_i = a_i - R r_i (mean exactly 0 at the estimated R), estimated by
    s² = Σ d_i² / (n - 1). Hence Var R ≈ Σ (a_i - R r_i)² / (n (n - 1) r̄²), and
    Σ (a_i - R r_i)² = Σ a² - 2 R Σ ar + R² Σ r² comes from the summed moments. The interval
    is R ± Z95 sqrt(Var R) (symmetric, not clipped). None: fewer than two rows or no round."""
    if n < 2 or sum_r <= 0:
        return None
    r = sum_a / sum_r
    residual = max(sum_aa - 2 * r * sum_ar + r * r * sum_rr, 0.0)  # rounding can dip below 0
    mean_r = sum_r / n
    h = Z95 * math.sqrt(residual / (n * (n - 1) * mean_r * mean_r))
    return r - h, r + h


def accepted_prefix_ci95(sums: dict[str, torch.Tensor], prefix: str = "") -> list[float] | None:
    """`eval_accepted_prefix_ci95`: `ratio_ci95` of `round_sums`' totals (keys under `prefix`)
    as [lo, hi], or None."""
    ci = ratio_ci95(*(float(sums[prefix + k]) for k in (
        "rows", "round_accepted", "rounds", "row_accepted_sq", "row_rounds_sq",
        "row_accepted_rounds")))
    return None if ci is None else [ci[0], ci[1]]
