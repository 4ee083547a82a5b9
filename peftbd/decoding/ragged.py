"""The KV cache of a batch of requests of different lengths: a static slot pool per decoder.

`RaggedKV` is a pool: per layer one buffer (rows, heads, capacity, head_dim), allocated in
place and marked static for the compiler (`torch._dynamo.mark_static_address`, as gpt-fast's
static cache and transformers' `StaticCache` do), so a compiled graph that writes it mutates no
input but static ones and CUDA-graph trees replay it. A request takes a row when admitted
(`RowCache.empty`) and gives it back when its `RowCache` is dropped (or `release`d). A run that
knows what it will decode sizes the pool once (`size_for`: the benchmark, for all its passes;
`decode_many`, for its requests); otherwise the buffers grow (doubling rows or capacity, a new
static address) only when the pool is full (`allocations` counts allocations and growths).

A batched forward steps the pool's first `size` rows: `pack` makes the requests of a step rows
0..B-1 of their pool, in order, swapping rows in place when the batch changed (vLLM's persistent
batch, condensed), so a batch that keeps running moves nothing. Rows are left-aligned: row i's
committed positions fill slots [0, n_i). A forward runs one chunk of Q inputs per row, each
row's q_i real inputs first (padding after), written at slots [n_i, n_i + Q) after the chunks
appended since the last commit: every row at its own offset, so rows that accepted different
numbers of tokens need no realignment. A chunk is opened (`open_chunk`) before the forward that
writes it: the forward's writes (`write`, through a `peftbd.decoding.cache_adapter.CacheAdapter`)
go to the open chunk, and `chunk_mask` is its mask (a query sees its row's committed slots and,
inside the chunks appended since, their pattern, causal or the draft pattern, over real slots).
`commit` then keeps the first m_i slots of what the chunks appended (the accepted tokens) by
moving n_i: no copy. `drop` forgets the last chunk (a draft's) and moves nothing. Positions are
explicit per row.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch._dynamo import mark_static_address

from peftbd.decoding.row_batch import additive, chunk_allowed, own_pattern

_MIN_CAPACITY = 64


class RaggedKV:
    """A static KV slot pool and the batch of its first `size` rows (see module doc); layers are
    created on first write. `RaggedKV(lengths, device)`: a pool whose batch is len(lengths) rows
    of those committed lengths (no request owns them); `RaggedKV([], device)`: an empty pool.
    A `peftbd.decoding.cache_adapter.KVStore`: forwards take `CacheAdapter(kv)` as their cache."""

    def __init__(self, lengths: Sequence[int], device: torch.device) -> None:
        self.device = device
        self.keys: list[torch.Tensor] = []  # per layer (rows, heads, capacity, head_dim), static
        self.values: list[torch.Tensor] = []
        self._length = list(lengths)  # committed slots per pool row
        self._owners: list[weakref.ref[RowCache] | None] = [None] * len(self._length)
        self.size = len(self._length)  # the batch: rows 0..size-1
        self.allocations = 0  # times the buffers were allocated or grown (a new static address)
        self._planned = 0  # slots per row `size_for` asked for
        self._offset = 0  # slots appended after each row's committed ones, the open chunk's included
        self._chunks: list[tuple[int, torch.Tensor | None]] = []  # appended since commit: width, valid
        self._lengths_t: torch.Tensor | None = None
        self._slots: tuple[tuple[int, ...], torch.Tensor] | None = None  # (start, *shape), slots

    @property
    def lengths(self) -> list[int]:
        """The batch rows' committed lengths."""
        return self._length[: self.size]

    @property
    def rows(self) -> int:
        """Rows in the pool (the batch's and every other request's)."""
        return len(self._length)

    @property
    def capacity(self) -> int:
        """Slots per row (0 before the first write)."""
        return self.keys[0].shape[2] if self.keys else 0

    @property
    def appended(self) -> int:
        """Slots per row appended since the last commit (the open chunk's included)."""
        return self._offset

    def take(self, cache: RowCache) -> int:
        """A free row for `cache` (empty): a finished request's, the batch's first (so the next
        step's batch moves nothing), never one of a batch in mid-round; the pool doubles its
        rows when none is free."""
        first = self.size if self._chunks else 0
        free = [r for r in range(first, self.rows) if self._owner(r) is None]
        if not free:
            free = [self.rows]
            self._reallocate(max(1, 2 * self.rows), self.capacity)
        row = free[0]
        self._length[row] = 0
        self._owners[row] = weakref.ref(cache)
        return row

    def release(self, row: int) -> None:
        """Give row `row` back to the pool (its request finished)."""
        self._owners[row] = None
        self._length[row] = 0

    def batch(self, caches: Sequence[RowCache]) -> None:
        """Make `caches` (rows of this pool) the batch: cache i at row i, rows swapped in place."""
        if self.size == len(caches) and all(c.row == i for i, c in enumerate(caches)):
            return
        if self._chunks:
            raise RuntimeError("a pool's batch changed with a chunk open: commit or drop it first")
        for i, cache in enumerate(caches):
            if cache.row != i:
                self._swap(i, cache.row)
        self.size = len(caches)
        self._lengths_t = self._slots = None

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
        self._ensure(layer_idx, key, end)
        if self.size == 1:  # one row: its chunk is one slice
            at = self.lengths[0] + start
            self.keys[layer_idx][:1, :, at : at + width] = key
            self.values[layer_idx][:1, :, at : at + width] = value
        else:
            slots = self._chunk_slots(key, start)
            write_rows(self.keys[layer_idx], key, slots)
            write_rows(self.values[layer_idx], value, slots)
        return self.keys[layer_idx][: self.size, :, :end], self.values[layer_idx][: self.size, :, :end]

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
        for row, count in enumerate(counts):
            self._length[row] += count
        self._lengths_t = self._slots = None
        self._offset = 0
        self._chunks = []

    def extend(self, row: int, count: int) -> None:
        """Row `row` committed `count` more slots written outside a batched forward (a packed
        prefill's, `peftbd.decoding.packed`)."""
        self._length[row] += count
        self._lengths_t = self._slots = None

    def lengths_tensor(self) -> torch.Tensor:
        """The batch rows' committed lengths (B,) on the pool's device."""
        return self._lengths_on(self.device)

    def reserve(self, end: int) -> None:
        """Grow every layer to hold at least `end` slots per row (the fast path's static KV)."""
        if self.keys and end > self.capacity:
            self._reallocate(self.rows, 2 * end)

    def size_for(self, rows: int, end: int) -> None:
        """Room for `rows` requests of up to `end` slots each, in one allocation made now (or at
        the first write, which sizes the layers): a run that sizes the pool for what it will
        decode meets no growth, so no new static address (each compiles new graphs and records
        new CUDA graphs). Past what is held, the pool grows at least twofold (fewer growths)."""
        self._planned = max(self._planned, end)
        if rows > self.rows or (self.keys and end > self.capacity):
            self._reallocate(max(rows, self.rows),
                             max(end, 2 * self.capacity) if end > self.capacity else self.capacity)

    def to(self, dtype: torch.dtype) -> None:
        """Cast every layer to `dtype` (the cost profiler's bf16 arms): new static buffers."""
        self.keys = [_static(k.to(dtype)) for k in self.keys]
        self.values = [_static(v.to(dtype)) for v in self.values]
        self.allocations += 1

    def _owner(self, row: int) -> RowCache | None:
        ref = self._owners[row]
        return None if ref is None else ref()

    def _ensure(self, layer_idx: int, like: torch.Tensor, end: int) -> None:
        """Layer `layer_idx` exists (shaped as `like`'s heads and head_dim) and holds `end` slots."""
        if end > self.capacity:
            self._reallocate(self.rows, max(_MIN_CAPACITY, 2 * end))
        if layer_idx == len(self.keys):
            shape = (self.rows, like.shape[1], max(self.capacity, _MIN_CAPACITY, 2 * end, self._planned),
                     like.shape[3])
            self.keys.append(_static(like.new_zeros(shape)))
            self.values.append(_static(like.new_zeros(shape)))
            self.allocations += 1

    def _reallocate(self, rows: int, capacity: int) -> None:
        """New static buffers of `rows` x `capacity` holding what the old ones held (the slots
        in use: committed, and any chunk appended since)."""
        grow = rows - self.rows
        self._length += [0] * grow
        self._owners += [None] * grow
        if not self.keys:
            return
        used = min(max(self._length) + self._offset, self.capacity)
        for store in (self.keys, self.values):
            for idx, old in enumerate(store):
                new = old.new_zeros(rows, old.shape[1], capacity, old.shape[3])
                new[: old.shape[0], :, :used] = old[:, :, :used]
                store[idx] = _static(new)
        self.allocations += 1

    def _swap(self, a: int, b: int) -> None:
        """Swap rows `a` and `b`: their committed slots, lengths and owners."""
        used = max(self._length[a], self._length[b])
        for store in (self.keys, self.values):
            for buf in store:
                held = buf[a, :, :used].clone()
                buf[a, :, :used] = buf[b, :, :used]
                buf[b, :, :used] = held
        self._length[a], self._length[b] = self._length[b], self._length[a]
        self._owners[a], self._owners[b] = self._owners[b], self._owners[a]
        for row in (a, b):
            owner = self._owner(row)
            if owner is not None:
                owner.row = row

    def _chunk_slots(self, key: torch.Tensor, start: int) -> torch.Tensor:
        """The slots (B, Q) of a chunk `key` (B, heads, Q, d) written at `start`: each row's
        n_i + start.. (built once per chunk, shared by every layer)."""
        if self._slots is None or self._slots[0] != (start, *key.shape):
            slots = (self._lengths_on(key.device) + start).unsqueeze(1) \
                + torch.arange(key.shape[2], device=key.device)
            self._slots = ((start, *key.shape), slots)
        return self._slots[1]

    def _lengths_on(self, device: torch.device) -> torch.Tensor:
        if self._lengths_t is None:
            self._lengths_t = torch.tensor(self.lengths, device=device)
        return self._lengths_t


def write_rows(buffer: torch.Tensor, chunk: torch.Tensor, slots: torch.Tensor) -> None:
    """Write `chunk` (B, heads, Q, d) into the first B rows of `buffer` (rows, heads, capacity,
    d), row i's at its `slots[i]` (Q,): one `index_put_`, in place (a `scatter_` is 200x slower
    in bf16 on CPU, and inductor copies the whole buffer for one)."""
    rows, heads = (torch.arange(n, device=chunk.device) for n in chunk.shape[:2])
    buffer.index_put_((rows.view(-1, 1, 1), heads.view(1, -1, 1), slots.unsqueeze(1)), chunk)


def _static(buffer: torch.Tensor) -> torch.Tensor:
    """`buffer`, marked as a static address for the compiler (see module doc)."""
    mark_static_address(buffer)
    return buffer


@dataclass(eq=False)
class RowCache:
    """One request's KV: row `row` of the pool `kv` (it holds the row while it lives)."""

    kv: RaggedKV
    row: int = 0

    def __post_init__(self) -> None:
        self.kv._owners[self.row] = weakref.ref(self)

    @classmethod
    def empty(cls, pool: RaggedKV) -> RowCache:
        """A new request's (empty) cache: a free row of `pool`."""
        cache = cls.__new__(cls)
        cache.kv, cache.row = pool, pool.take(cache)
        return cache

    def release(self) -> None:
        """Give the row back to the pool now (else when this cache is dropped); a second call,
        or one after the row went to another request, does nothing."""
        if self.kv._owner(self.row) is self:
            self.kv.release(self.row)

    def get_seq_length(self) -> int:
        """Committed positions."""
        return self.kv._length[self.row]

    def committed(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, views (1, heads, n, head_dim) of this row's committed keys and values."""
        n, r = self.get_seq_length(), self.row
        return [(k[r : r + 1, :, :n], v[r : r + 1, :, :n]) for k, v in zip(self.kv.keys, self.kv.values)]

    def append(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Commit q more positions to this row from another cache's keys and values: per layer
        (1, heads, q, head_dim), the first len(layers) layers (deeper ones fall behind)."""
        kv, n = self.kv, self.get_seq_length()
        if kv._chunks and self.row < kv.size:
            raise RuntimeError("append() to a row of a batch with a chunk open: commit or drop it first")
        q = layers[0][0].shape[2]
        for idx, (key, value) in enumerate(layers):
            kv._ensure(idx, key, n + q)
            kv.keys[idx][self.row, :, n : n + q] = key[0].to(kv.keys[idx].dtype)
            kv.values[idx][self.row, :, n : n + q] = value[0].to(kv.values[idx].dtype)
        kv.extend(self.row, q)

    def move_to(self, pool: RaggedKV) -> None:
        """Move this row into `pool` (a free row there, its committed slots copied)."""
        layers, old = self.committed(), self.kv
        row = pool.take(self)
        old.release(self.row)
        self.kv, self.row = pool, row
        if layers and layers[0][0].shape[2]:
            self.append(layers)

    def __deepcopy__(self, memo: dict) -> RowCache:
        """A copy in another row of the same pool (the pool itself is never copied)."""
        copy = RowCache.empty(self.kv)
        if self.get_seq_length():
            copy.append(self.committed())
        return copy


def pack(caches: Sequence[RowCache]) -> RaggedKV:
    """The pool whose batch rows 0..B-1 are `caches` (see module doc): the first cache's pool,
    any other pool's rows moved into it, rows swapped in place when the batch changed."""
    pool = caches[0].kv
    for cache in caches:
        if cache.kv is not pool:
            cache.move_to(pool)
    pool.batch(caches)
    return pool
