"""The one place the engine imitates transformers' cache protocol.

A transformers model writes and reads its keys and values through the object it is given as
`cache=`: its attention layers call `update`, and its mask builder, when the caller passes no
mask, asks `get_query_offset` and `get_mask_sizes`. The engine keeps its KV in its own stores
(`peftbd.decoding.ragged.RaggedKV`; the fast path's static slots) and hands every forward a
`CacheAdapter` over one of them instead of a transformers `Cache`. The adapter is not a `Cache`
subclass on purpose: transformers then treats it as a plain object and calls nothing else (no
sliding-window or paged-cache paths). `PROTOCOL` names what it implements;
`tests/peftbd/decoding/test_cache_adapter.py` pins it to the installed transformers (within
pyproject.toml's range): a Qwen3 forward calls exactly these, and gives what a `DynamicCache` gives.
"""

from __future__ import annotations

from typing import Protocol

import torch


class KVStore(Protocol):
    """The engine's side of a `CacheAdapter`: where a forward's keys and values go."""

    def write(self, key: torch.Tensor, value: torch.Tensor,
              layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store layer `layer_idx`'s keys and values (B, heads, Q, head_dim) of the chunk being
        run; return the keys and values (B, heads, slots, head_dim) its queries attend over."""

    def extent(self) -> tuple[int, int]:
        """(query offset, key length) of a one-row causal chunk whose mask transformers builds."""


class CacheAdapter:
    """A `KVStore` as transformers' attention and mask builder see a cache (see module doc)."""

    PROTOCOL = frozenset({"update", "get_query_offset", "get_mask_sizes"})
    """The members of transformers' `Cache` it implements: all a Qwen3 forward calls on it."""

    def __init__(self, store: KVStore) -> None:
        self.store = store

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        return self.store.write(key_states, value_states, layer_idx)

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.store.extent()[0]

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.store.extent()[1], 0
