"""Batches of rows of different lengths as tensors: left-aligned inputs (`left_aligned`,
`padded_ids`, `row_entries`) and the masks of a chunk over a ragged KV pool (`chunk_allowed`,
`additive`, `own_pattern`; `peftbd.decoding.ragged`'s module doc says how slots are laid out).
Pure tensor code, no state: the fast path builds its masks with it inside compiled graphs."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def own_pattern(pattern: torch.Tensor | None, width: int, device: torch.device) -> torch.Tensor:
    """A chunk's own attention pattern, bool (width, width): `pattern`, or causal for None."""
    if pattern is None:
        return torch.ones(width, width, dtype=torch.bool, device=device).tril()
    return pattern.to(device)


def chunk_allowed(lengths: torch.Tensor, real: torch.Tensor, pattern: torch.Tensor,
                  slots: torch.Tensor) -> torch.Tensor:
    """Bool (B, width, S): which of the slots `slots` (0..S-1) each query of the open chunk
    sees. Row i committed `lengths[i]` slots, then the chunks appended since fill `real`'s (B,
    offset) slots (True: a real input), the open chunk last, `pattern` (width, width) wide. A
    query sees its row's committed slots, the real slots of the earlier chunks and, in its own
    chunk, `pattern` over real slots. Pure tensor code: the fast path builds its masks with it
    inside the compiled graph (`peftbd.decoding.fast_path`)."""
    offset, width = real.shape[1], pattern.shape[0]
    own_start = offset - width
    rel = slots.unsqueeze(0) - lengths.unsqueeze(1)  # (B, S)
    appended = (rel >= 0) & (rel < offset) & real.gather(1, rel.clamp(0, offset - 1))
    seen = (rel < 0) | (appended & (rel < own_start))  # committed, or an earlier chunk's
    in_own = pattern[:, (rel - own_start).clamp(0, width - 1)].transpose(0, 1)  # (B, Q, slots)
    return seen.unsqueeze(1) | (in_own & (appended & (rel >= own_start)).unsqueeze(1))


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive (B, 1, Q, slots) mask of bool `allowed` (B, Q, slots): 0 where a query may
    attend, `finfo(dtype).min` elsewhere (transformers passes a 4D mask through as is)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min).unsqueeze(1)


def left_aligned(rows: Sequence[torch.Tensor], fill: float | int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack `rows` (each (q_i, ...)) as (B, Q, ...), each row's entries first, then `fill`;
    and the bool (B, Q) mask of real entries."""
    width = max(r.shape[0] for r in rows)
    first = rows[0]
    out = torch.full((len(rows), width, *first.shape[1:]), fill, dtype=first.dtype, device=first.device)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
        valid[i, : r.shape[0]] = True
    return out, valid


def padded_ids(rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """`left_aligned` of int rows (ids, positions) in one tensor call: (B, Q) long, 0 after
    each row's entries; and the bool (B, Q) mask of real entries."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[*r, *[0] * (width - len(r))] for r in rows], dtype=torch.long)
    valid = torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows])
    return ids, valid


def row_entries(batch: torch.Tensor, row: int, start: int, n: int) -> torch.Tensor:
    """(1, n, ...): entries start..start+n-1 of row `row` of left-aligned `batch` (B, Q, ...)."""
    return batch[row : row + 1, start : start + n]
