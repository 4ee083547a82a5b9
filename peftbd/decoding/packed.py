"""Packed, chunked prefill: the prompts of a step run as one sequence with no padding.

The prompts' tokens are laid end to end and cut into forwards of at most `chunk` tokens (a long
prompt spans several; vLLM's and Sarathi's chunked prefill). A forward's input is one row
(1, T): each token carries its own position and its request's pool row, its keys and values go
straight to that row of the static KV pool (`peftbd.decoding.ragged.RaggedKV`), and it attends,
causally, to its own prompt's tokens only: those of this forward and, for a later piece of a
prompt cut between forwards, the ones an earlier forward wrote to the pool. So a prefill computes
exactly the prompt tokens (`Segment.tokens` add up to them), where a padded batch computes B x the
longest.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from peftbd.decoding.ragged import RaggedKV, RowCache
from peftbd.decoding.row_batch import additive


PREFILL_CHUNK = 512
"""Tokens per packed prefill forward by default (`decoding.prefill_chunk`)."""


@dataclass(frozen=True)
class Segment:
    """Tokens [start, end) of request `request`'s prompt, in one packed forward."""

    request: int
    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start


def packed_chunks(lengths: Sequence[int], chunk: int,
                  done: Sequence[int] | None = None) -> Iterator[list[Segment]]:
    """The forwards of a packed prefill of prompts of `lengths` whose first `done` tokens (None:
    none) are prefilled already: each at most `chunk` tokens, the prompts in order, a prompt cut
    where a forward fills up."""
    if chunk < 1:
        raise ValueError(f"prefill chunk={chunk}; decoding.prefill_chunk must be >= 1")
    forward: list[Segment] = []
    room = chunk
    for request, length in enumerate(lengths):
        start = 0 if done is None else done[request]
        while start < length:
            end = min(length, start + room)
            forward.append(Segment(request, start, end))
            room -= end - start
            start = end
            if room == 0:
                yield forward
                forward, room = [], chunk
    if forward:
        yield forward


class PackedKV:
    """The `KVStore` of one packed forward (see module doc): token t of the row goes to slot
    `slots[t]` of pool row `rows[t]`; its queries see the prefixes `prefixes` ((row, n): the
    first n slots of a pool row, read back from the pool) and then the forward's own keys."""

    def __init__(self, pool: RaggedKV, rows: torch.Tensor, slots: torch.Tensor,
                 prefixes: Sequence[tuple[int, int]], end: int) -> None:
        self.pool, self.rows, self.slots, self.prefixes, self.end = pool, rows, slots, prefixes, end

    def write(self, key: torch.Tensor, value: torch.Tensor,
              layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.pool._ensure(layer_idx, key, self.end)
        out = []
        for store, new in ((self.pool.keys, key), (self.pool.values, value)):
            buffer = store[layer_idx]
            buffer[self.rows, :, self.slots] = new[0].transpose(0, 1).to(buffer.dtype)
            seen = [buffer[r : r + 1, :, :n] for r, n in self.prefixes]
            out.append(torch.cat([*seen, new], 2) if seen else new)
        return out[0], out[1]

    def extent(self) -> tuple[int, int]:
        """One prompt's first piece alone: transformers' own causal mask over its tokens."""
        return 0, self.rows.shape[0]


@dataclass(frozen=True)
class PackedForward:
    """One packed forward's inputs: ids and positions (1, T), its store, and its additive mask
    (1, 1, T, prefix slots + T), None when transformers' causal mask is the same (one prompt's
    first piece alone)."""

    ids: torch.Tensor
    positions: torch.Tensor
    store: PackedKV
    mask: torch.Tensor | None


def packed_forward(prompts: Sequence[Sequence[int]], caches: Sequence[RowCache],
                   segments: Sequence[Segment], dtype: torch.dtype) -> PackedForward:
    """The inputs of the packed forward of `segments` (of `prompts`, whose KV goes to `caches`,
    rows of one pool; a segment's cache holds its prompt's tokens before `start`)."""
    pool = caches[0].kv
    device = pool.device
    ids: list[int] = []
    positions: list[int] = []
    rows: list[int] = []
    owner: list[int] = []  # per token: its prefix's index, -1 for none
    prefixes: list[tuple[int, int]] = []
    for s in segments:
        cache = caches[s.request]
        if cache.kv is not pool or cache.get_seq_length() != s.start:
            raise RuntimeError(f"prompt {s.request}'s cache holds {cache.get_seq_length()} tokens, "
                               f"not the {s.start} before its piece, or is not in the step's pool")
        ids += prompts[s.request][s.start : s.end]
        positions += range(s.start, s.end)
        rows += [cache.row] * s.tokens
        owner += [len(prefixes) if s.start else -1] * s.tokens
        if s.start:
            prefixes.append((cache.row, s.start))
    pos = torch.tensor(positions, device=device)
    store = PackedKV(pool, torch.tensor(rows, device=device), pos, prefixes,
                     max(s.end for s in segments))
    mask = None
    if len(segments) > 1 or prefixes:
        mask = additive(_allowed(segments, prefixes, owner, device), dtype)
    return PackedForward(torch.tensor([ids], device=device), pos.unsqueeze(0), store, mask)


def _allowed(segments: Sequence[Segment], prefixes: Sequence[tuple[int, int]], owner: list[int],
             device: torch.device) -> torch.Tensor:
    """Bool (1, T, prefix slots + T): each token sees its own prompt's earlier slots (its
    prefix from the pool, if any) and, in this forward, its own segment causally."""
    total = sum(s.tokens for s in segments)
    segment = torch.repeat_interleave(torch.arange(len(segments), device=device),
                                      torch.tensor([s.tokens for s in segments], device=device))
    own = (segment[:, None] == segment[None, :]) & torch.ones(total, total, dtype=torch.bool,
                                                              device=device).tril()
    width = sum(n for _, n in prefixes)
    seen = torch.zeros(total, width, dtype=torch.bool, device=device)
    at = 0
    for p, (_, n) in enumerate(prefixes):
        seen[:, at : at + n] = torch.tensor([o == p for o in owner], device=device)[:, None]
        at += n
    return torch.cat([seen, own], 1).unsqueeze(0)
