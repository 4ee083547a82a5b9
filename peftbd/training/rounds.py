"""The offline estimate of the engine's PEFT-BD rounds: greedy speculative decoding replayed on
artifact rows.

A row's continuation y_P..y_{n-1} is the verifier's greedy output (stopped at EOS or after
`budget` tokens), so greedy verification of a draft accepts exactly its longest prefix that
matches the continuation, and what the engine commits is the continuation itself. The replay
runs the rounds of `SpeculativeDecoder` with a `PeftBDDrafter` (one denoising step) and a budget
of `budget` new tokens: prefill commits y_P; a round at position c (y_0..y_{c-1} committed)
drafts against the clean KV of y_0..y_{c-2} with the chunk `[y_{c-1}, masks]` (the training
chunk at t = 1), proposes k = min(D, budget - (c - P) - 1) tokens (the engine's cap: the
remaining budget - 1), accepts the longest prefix a matching y_c..y_{n-1} and moves to
c + a + 1 (accepted + bonus); rounds go on while c < n. A row that ended on EOS before the budget
can so draft its EOS, as the engine does.

All rows of a batch draft together, one forward per round against one clean KV computed once (a
finished row's chunk is a dummy). What can still differ from the engine: float noise of batched
vs incremental KV (an argmax near-tie may flip). Drafted tokens past an EOS count as accepted in
neither (the engine counts up to the committed output, EOS included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from peft import PeftModel
from transformers import DynamicCache

from peftbd.models.peft_bd import adapted_logits
from peftbd.training.block_diffusion import build_draft_batch, chunk_hidden_states, clean_cache
from peftbd.training.examples import SequenceBatch


@dataclass(frozen=True)
class Round:
    """One replayed round: `proposed` draft tokens, of which the first `accepted` match."""

    proposed: int
    accepted: int


def _drafts(
    model: PeftModel, batch: SequenceBatch, cache: DynamicCache, starts: list[list[int]], *,
    block_size: int, mask_id: int, pad_id: int, anchored: bool,
) -> torch.Tensor:
    """Long (B, D) on the CPU: each row's t = 1 draft from its one start (dummies elsewhere)."""
    draft = build_draft_batch(
        batch, starts, block_size=block_size, mask_id=mask_id, pad_id=pad_id, anchored=anchored,
        gamma=1.0, t_range=(1.0, 1.0), seed=0, epoch=0, dtype=next(model.parameters()).dtype,
    ).to(batch.ids.device)
    hidden = draft.block_view(chunk_hidden_states(model, draft, cache))[:, 0]
    # the adapter-on head without peft's per-call copy of the whole table (one per round)
    logits = adapted_logits(model.get_base_model(), hidden).float()
    logits[..., mask_id] = -math.inf  # as the engine: the mask token is never proposed
    return logits.argmax(-1).cpu()


@torch.no_grad()
def replay_rounds(
    model: PeftModel, batch: SequenceBatch, *, budget: int, block_size: int, mask_id: int,
    pad_id: int, anchored: bool,
) -> list[list[Round]]:
    """Each row's rounds, in order (see module doc; a row longer than `budget` is replayed with
    its own length as the budget)."""
    ids, lengths, prompt_lens = batch.ids.cpu(), batch.lengths.tolist(), batch.prompt_lens.tolist()
    position = [p + 1 for p in prompt_lens]  # prefill committed y_P
    cache = clean_cache(model, batch.ids)
    rounds: list[list[Round]] = [[] for _ in lengths]
    while any(c < n for c, n in zip(position, lengths)):
        starts = [[c] if c < n else [] for c, n in zip(position, lengths)]
        drafted = _drafts(model, batch, cache, starts, block_size=block_size, mask_id=mask_id,
                          pad_id=pad_id, anchored=anchored)
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
    """`rounds`, `round_proposed` and `round_accepted` over every row (summable)."""
    flat = [x for row in rounds for x in row]
    return {
        "rounds": torch.tensor(float(len(flat))),
        "round_proposed": torch.tensor(float(sum(x.proposed for x in flat))),
        "round_accepted": torch.tensor(float(sum(x.accepted for x in flat))),
    }
