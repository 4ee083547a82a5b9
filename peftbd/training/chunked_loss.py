"""Cross-entropy over a large vocabulary without holding every position's logits at once.

A training step of either objective scores N positions against the whole vocabulary: at
Qwen3-0.6B's 151,936 rows, 64 sequences of 768 tokens are 29.8 GB of fp32 logits. Here the N
positions go through `logits_fn` (the LM head) `chunk_rows` at a time; each chunk's loss is
computed under activation checkpointing (`torch.utils.checkpoint`, non-reentrant), so only the
chunk's input hidden states are kept for backward and its logits are recomputed there, one chunk
at a time. A step so holds at most one chunk of logits (plus its gradient) whatever N is.

The loss is the same sum as the unchunked one, added up in another order (equal within float
rounding; tested); there is no randomness in `logits_fn`, so the recomputation is exact and a
run stays deterministic. `chunk_rows = 0` is one chunk of all N without checkpointing: the
plain computation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

LogitsFn = Callable[[torch.Tensor], torch.Tensor]
"""(n, hidden) -> (n, vocab): the LM head applied to some positions' hidden states."""


@dataclass(frozen=True)
class TokenScores:
    """What a loss needs from the logits of N positions."""

    weighted_ce: torch.Tensor  # scalar: sum_i w_i * CE_i (keeps the graph)
    hits: torch.Tensor  # bool (N,): top-1 (the excluded id never predicted) == target; detached


def _score(hidden: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None,
           logits_fn: LogitsFn, exclude_id: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    logits = logits_fn(hidden).float()
    ce = F.cross_entropy(logits, targets, reduction="none")
    total = ce.sum() if weights is None else (weights * ce).sum()
    with torch.no_grad():
        scores = logits.detach()
        if exclude_id is not None:  # as the engine drafts: this id is never proposed
            scores = scores.index_fill(1, torch.tensor([exclude_id], device=scores.device), -torch.inf)
        hits = scores.argmax(-1) == targets
    return total, hits


def chunked_scores(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    logits_fn: LogitsFn,
    *,
    chunk_rows: int,
    weights: torch.Tensor | None = None,
    exclude_id: int | None = None,
) -> TokenScores:
    """Weighted cross-entropy sum and top-1 hits of `hidden` (N, d) against `targets` (N,),
    `chunk_rows` positions per LM-head call (0: all at once; see module doc). `weights` (N,)
    default to 1; `exclude_id` is never a top-1 prediction (the loss still covers it)."""
    n = hidden.shape[0]
    if chunk_rows < 0:
        raise ValueError(f"chunk_rows={chunk_rows}: use 0 (all positions at once) or a positive count")
    if chunk_rows == 0:
        total, hit = _score(hidden, targets, weights, logits_fn, exclude_id)
        return TokenScores(total, hit)
    totals: list[torch.Tensor] = []
    hits: list[torch.Tensor] = []
    grad = torch.is_grad_enabled()  # the head's own weights may train even if `hidden` does not
    for start in range(0, max(n, 1), chunk_rows):  # one chunk, too, is checkpointed: FastMTP's
        # steps each score one, and their logits would otherwise all wait for the backward
        rows = slice(start, start + chunk_rows)
        args = (hidden[rows], targets[rows], None if weights is None else weights[rows])
        if grad:
            total, hit = checkpoint(_score, *args, logits_fn, exclude_id, use_reentrant=False)
        else:
            total, hit = _score(*args, logits_fn, exclude_id)
        totals.append(total)
        hits.append(hit)
    return TokenScores(torch.stack(totals).sum(), torch.cat(hits))
