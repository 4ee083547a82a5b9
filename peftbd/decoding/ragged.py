"""The KV cache of a batch of requests of different lengths, and how batched forwards use it.

`RaggedKV` holds B rows in one buffer per layer (B, heads, capacity, head_dim), left-aligned:
row i's committed positions fill slots [0, n_i). A forward runs one chunk of Q inputs per row,
each row's q_i real inputs first (padding after), written at slots [n_i, n_i + Q) after the
chunks appended since the last commit: every row at its own offset, so rows that accepted
different numbers of tokens need no realignment. A chunk is opened (`open_chunk`) before the
forward that writes it: the forward's writes (`write`, through a
`peftbd.decoding.cache_adapter.CacheAdapter`) go to the open chunk, and `chunk_mask` is its mask
(a query sees its row's committed slots and, inside the chunks appended since, their pattern,
causal or the draft pattern, over real slots). `commit` then keeps the first m_i slots of what
the chunks appended (the accepted tokens) by moving n_i: no copy. `drop` forgets the last chunk
(a draft's) and moves nothing. Positions are explicit per row.

A request's `DecodeState` holds `RowCache`s: (a `RaggedKV`, its row). A batched call `pack`s
its states' row caches: when they already are the rows 0..B-1 of one `RaggedKV` (a batch that
keeps running) that buffer is used as is; otherwise (rows joined or left, or a server batching
whichever requests arrived) their rows are copied into a new one, which they then point to.
One request alone is the batch-1 engine: its own one-row buffer, never copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_MIN_CAPACITY = 64


class RaggedKV:
    """Rows of per-layer keys and values (see module doc); layers are created on first write.
    A `peftbd.decoding.cache_adapter.KVStore`: forwards take `CacheAdapter(kv)` as their cache."""

    def __init__(self, lengths: Sequence[int], device: torch.device) -> None:
        self.lengths = list(lengths)
        self.device = device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._offset = 0  # slots appended after each row's committed ones, the open chunk's included
        self._chunks: list[tuple[int, torch.Tensor | None]] = []  # appended since commit: width, valid
        self._lengths_t: torch.Tensor | None = None
        self._index: tuple[tuple[int, ...], torch.Tensor] | None = None  # (start, *shape), index

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def appended(self) -> int:
        """Slots per row appended since the last commit (the open chunk's included)."""
        return self._offset

    def open_chunk(self, valid: torch.Tensor | None, width: int) -> None:
        """Open the next chunk (`width` slots per row; `valid` (B, width) bool: which are real,
        left-aligned; None: all): the next forward's `write`s go there, `chunk_mask` is its mask."""
        self._chunks.append((width, valid))
        self._offset += width

    def write(self, key: torch.Tensor, value: torch.Tensor,
              layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the open chunk's keys/values (B, heads, Q, d) at each row's offset; the keys/values
        of every slot a query of this chunk may see (the mask says which)."""
        width = key.shape[2]
        if not self._chunks or self._chunks[-1][0] != width:
            raise RuntimeError(f"a forward wrote a chunk of {width} slots, but the open chunk has "
                               f"{self._chunks[-1][0] if self._chunks else 'none'}: open_chunk first")
        start = self._offset - width
        end = max(self.lengths) + self._offset
        if layer_idx == len(self.keys):
            shape = (self.size, key.shape[1], max(_MIN_CAPACITY, 2 * end), key.shape[3])
            self.keys.append(key.new_zeros(shape))
            self.values.append(value.new_zeros(shape))
        if end > self.keys[layer_idx].shape[2]:
            self._grow(layer_idx, 2 * end)
        if self.size == 1:  # one row: its chunk is one slice
            at = self.lengths[0] + start
            self.keys[layer_idx][:, :, at : at + width] = key
            self.values[layer_idx][:, :, at : at + width] = value
        else:
            index = self._chunk_index(key, start)
            self.keys[layer_idx].scatter_(2, index, key)
            self.values[layer_idx].scatter_(2, index, value)
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def extent(self) -> tuple[int, int]:
        """(query offset, key length) of the open chunk of one row, for the mask transformers
        builds when `chunk_mask` is None: it starts after the row's committed slots and the
        chunks before it."""
        if self.size != 1:
            raise RuntimeError(f"transformers asked for a mask's sizes over {self.size} rows; "
                               "a batched forward must pass chunk_mask")
        end = self.lengths[0] + self._offset
        return end - self._chunks[-1][0], end

    def chunk_mask(self, pattern: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
        """The open chunk's additive mask (B, 1, width, slots): `chunk_allowed` over the slots
        written so far. None for one row's causal chunk after real slots only: transformers
        builds that mask (the batch-1 engine's)."""
        if self.size == 1 and pattern is None and all(v is None for _, v in self._chunks):
            return None
        allowed = chunk_allowed(self._lengths_on(self.device), self.appended_real(),
                                own_pattern(pattern, self._chunks[-1][0], self.device),
                                torch.arange(max(self.lengths) + self._offset, device=self.device))
        return additive(allowed, dtype)

    def appended_real(self) -> torch.Tensor:
        """Bool (B, offset): which slots of the chunks appended since the last commit (the open
        one's last) are real inputs."""
        return torch.cat([torch.ones(self.size, w, dtype=torch.bool, device=self.device) if v is None
                          else v.to(self.device) for w, v in self._chunks], 1)

    def drop(self) -> None:
        """Forget the last chunk (a draft step's KV: the next chunk overwrites it)."""
        width, _ = self._chunks.pop()
        self._offset -= width

    def commit(self, counts: Sequence[int]) -> None:
        """Row i keeps the first `counts[i]` slots the chunks appended since the last commit
        (they must be real slots: a chunk's real inputs come first); the rest is dropped."""
        self.lengths = [n + c for n, c in zip(self.lengths, counts)]
        self._lengths_t = self._index = None
        self._offset = 0
        self._chunks = []

    def _chunk_index(self, key: torch.Tensor, start: int) -> torch.Tensor:
        """The scatter index of a chunk `key` (B, heads, Q, d) written at `start`: each row's
        slots n_i + start.. (built once per chunk, shared by every layer)."""
        if self._index is None or self._index[0] != (start, *key.shape):
            slots = (self._lengths_on(key.device) + start).unsqueeze(1) \
                + torch.arange(key.shape[2], device=key.device)
            self._index = ((start, *key.shape), slots[:, None, :, None].expand_as(key))
        return self._index[1]

    def _grow(self, layer_idx: int, capacity: int) -> None:
        for store in (self.keys, self.values):
            old = store[layer_idx]
            new = old.new_zeros(*old.shape[:2], capacity, old.shape[3])
            new[:, :, : old.shape[2]] = old
            store[layer_idx] = new

    def _lengths_on(self, device: torch.device) -> torch.Tensor:
        if self._lengths_t is None:
            self._lengths_t = torch.tensor(self.lengths, device=device)
        return self._lengths_t

    def lengths_tensor(self) -> torch.Tensor:
        """The rows' committed lengths (B,) on the cache's device."""
        return self._lengths_on(self.device)

    def reserve(self, end: int) -> None:
        """Grow every layer to hold at least `end` slots per row (the fast path's static KV)."""
        for idx in range(len(self.keys)):
            if end > self.keys[idx].shape[2]:
                self._grow(idx, 2 * end)

    def to(self, dtype: torch.dtype) -> None:
        """Cast every layer to `dtype` in place (the cost profiler's bf16 arms)."""
        self.keys = [k.to(dtype) for k in self.keys]
        self.values = [v.to(dtype) for v in self.values]


@dataclass
class RowCache:
    """One request's KV: row `row` of `kv`."""

    kv: RaggedKV
    row: int = 0

    @classmethod
    def empty(cls, device: torch.device) -> RowCache:
        """A new request's (one-row, empty) cache."""
        return cls(RaggedKV([0], device))

    def get_seq_length(self) -> int:
        """Committed positions."""
        return self.kv.lengths[self.row]

    def committed(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, views (1, heads, n, head_dim) of this row's committed keys and values."""
        n, r = self.get_seq_length(), self.row
        return [(k[r : r + 1, :, :n], v[r : r + 1, :, :n]) for k, v in zip(self.kv.keys, self.kv.values)]

    def append(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Commit q more positions to this row from another cache's keys and values: per layer
        (1, heads, q, head_dim), the first len(layers) layers (deeper ones fall behind)."""
        kv, r, n = self.kv, self.row, self.get_seq_length()
        q = layers[0][0].shape[2]
        for idx, (key, value) in enumerate(layers):
            if idx == len(kv.keys):
                shape = (kv.size, key.shape[1], max(_MIN_CAPACITY, 2 * (n + q)), key.shape[3])
                kv.keys.append(key.new_zeros(shape))
                kv.values.append(value.new_zeros(shape))
            if n + q > kv.keys[idx].shape[2]:
                kv._grow(idx, 2 * (n + q))
            kv.keys[idx][r, :, n : n + q] = key[0].to(kv.keys[idx].dtype)
            kv.values[idx][r, :, n : n + q] = value[0].to(kv.values[idx].dtype)
        kv.commit([q if i == r else 0 for i in range(kv.size)])


def pack(caches: Sequence[RowCache]) -> RaggedKV:
    """One `RaggedKV` whose rows 0..B-1 are `caches` (see module doc): theirs when they already
    are, else a new one with their rows copied in, which `caches` then point to."""
    first = caches[0].kv
    if first.size == len(caches) and all(c.kv is first and c.row == i for i, c in enumerate(caches)):
        return first
    packed = RaggedKV([c.get_seq_length() for c in caches], first.device)
    if all(c.kv is first for c in caches):  # rows of one buffer (others finished): one gather
        rows = torch.tensor([c.row for c in caches], device=first.device)
        packed.keys = [k.index_select(0, rows) for k in first.keys]
        packed.values = [v.index_select(0, rows) for v in first.values]
        for i, c in enumerate(caches):
            c.kv, c.row = packed, i
        return packed
    layers = max(len(c.kv.keys) for c in caches)
    width = max(packed.lengths)
    for idx in range(layers):
        ref = next(c.kv.keys[idx] for c in caches if len(c.kv.keys) > idx)
        shape = (len(caches), ref.shape[1], max(_MIN_CAPACITY, 2 * width), ref.shape[3])
        keys, values = ref.new_zeros(shape), ref.new_zeros(shape)
        for i, c in enumerate(caches):
            n = c.get_seq_length()
            if n and len(c.kv.keys) > idx:
                keys[i, :, :n] = c.kv.keys[idx][c.row, :, :n]
                values[i, :, :n] = c.kv.values[idx][c.row, :, :n]
        packed.keys.append(keys)
        packed.values.append(values)
    for i, c in enumerate(caches):
        c.kv, c.row = packed, i
    return packed


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
