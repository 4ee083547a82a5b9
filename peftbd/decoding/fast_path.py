"""The forward paths (`decoding.fast_path`): every model forward of a round runs through one
`ForwardPath`, eager (`EAGER`) or compiled (`FastPath`), the same call either way.

A forward site hands the path a `call(mask, cache, *args)` (a module-level function: the
compiled graph is keyed on it), the `RaggedKV` it writes and its `Chunk` (width, valid inputs,
attention pattern). The eager path opens the chunk and builds its mask (`RaggedKV.chunk_mask`).
The fast path runs `torch.compile`d graphs over static KV: the graph writes each row's chunk into
the `RaggedKV` buffers at the row's own offset and attends over the buffer's first slots, the
rows' slots rounded up to 64 (`_bucket`), under a mask it builds itself
(`peftbd.decoding.row_batch.chunk_allowed`), so its shapes (batch, chunk width, slots seen) do not
change with each token. They are compiled dynamic: a graph per call
for batch 1 and B > 1 times width 1 and wider (torch specializes sizes of 1); fixed shapes
(`dynamic=False`) recompiled at every capacity growth and batch change (7 graphs, 165 s, for one
AR pass at batch 1 and 16 on the 2-core box). Inductor on CPU; CUDA graphs
(`mode="reduce-overhead"`) on CUDA. Compile time is kept apart from steady state (`compile_s`,
one log line per compile).

On the fast path the verify (with or without verifier features), every drafter's draft forward
(PEFT-BD's adapter-on block, FastMTP's steps, the heads' context and block) and catching a state
up are compiled. A forward into a store that has no buffers yet runs eager, since its first write
sizes them: that is every prefill (one forward per request, of a new width each time) and a
head's first context. Tokens equal eager's; logits need not be bit-identical (fused kernels round
differently). A batch with sampled rows runs the same graph: their logits come from its hidden
states through the eager LM head (`peftbd.decoding.verify.choose`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
from torch._dynamo import config as dynamo_config
from torch.fx.experimental import _config as shape_config
from torch._dynamo.utils import counters
from torch.nn import functional as F
from transformers import AttentionInterface

from peftbd.decoding.cache_adapter import CacheAdapter
from peftbd.decoding.ragged import RaggedKV, write_rows
from peftbd.decoding.row_batch import additive, chunk_allowed, own_pattern

log = logging.getLogger(__name__)

_ATTENTION = "peftbd_gqa_sdpa"
_GRAPHS = 256
_BUCKET = 64
T = TypeVar("T")


def _gqa_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor, scaling: float | None = None, **kwargs: object
              ) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention (inference, a mask given) with grouped KV heads read as they
    are: its compiled form otherwise copies every KV head group out of the whole buffer. A few
    queries in half precision (a decode or verify step) run `_grouped_attention` instead."""
    groups: int = getattr(module, "num_key_value_groups")
    if query.dtype in _HALF and query.shape[2] <= _FEW_QUERIES:
        out = _grouped_attention(query, key, value, attention_mask, scaling, groups)
    else:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                             scale=scaling, enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


_HALF = (torch.bfloat16, torch.float16)
_FEW_QUERIES = 32


def _grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       mask: torch.Tensor | None, scaling: float | None, groups: int) -> torch.Tensor:
    """Attention (B, H, Q, d) as transformers' eager attention computes it (the products in the
    KV's dtype, mask and softmax in float32), each KV head's `groups` query heads stacked as its
    queries: two batched matmuls over the KV as it lies. For a few queries in half precision the
    CPU's fused SDPA kernel costs several times as much, more so the more rows a batch has."""
    batch, heads, width, dim = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    q = query.reshape(batch, kv_heads, groups * width, dim)
    # K as the left operand, as it lies (slots x d): a transposed K would be copied out first
    scores = torch.matmul(key, q.transpose(-1, -2)).transpose(-1, -2)
    scores = scores.reshape(batch, kv_heads, groups, width, slots)
    scores = scores.float() * (dim ** -0.5 if scaling is None else scaling)
    if mask is not None:
        scores = scores + mask.unsqueeze(1)
    weights = scores.softmax(-1).to(value.dtype)
    out = torch.matmul(weights.view(batch, kv_heads, groups * width, slots), value)
    return out.view(batch, heads, width, dim)


AttentionInterface.register(_ATTENTION, _gqa_sdpa)


class _StaticKV:
    """The graph's `KVStore` (`peftbd.decoding.cache_adapter`): write row i's chunk at its
    `slots[i]`, return the buffer's first `extent` slots (the mask says which a query sees).
    `index_put_`, which inductor writes in place (a `scatter_` would copy the whole buffer every
    layer)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], slots: torch.Tensor,
                 extent: int) -> None:
        self.keys, self.values, self.slots, self.slots_seen = keys, values, slots, extent

    def write(self, key: torch.Tensor, value: torch.Tensor,
              layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        write_rows(self.keys[layer_idx], key, self.slots)
        write_rows(self.values[layer_idx], value, self.slots)
        batch = key.shape[0]  # the pool's first rows
        return (self.keys[layer_idx][:batch, :, : self.slots_seen],
                self.values[layer_idx][:batch, :, : self.slots_seen])

    def extent(self) -> tuple[int, int]:
        raise RuntimeError("the fast path passes its own mask: transformers never sizes one")


@dataclass(frozen=True)
class Chunk:
    """What one forward writes: `width` slots per row, of which `valid` (B, width) bool are
    real (left-aligned; None: all), attending in the chunk by `pattern` (bool (width, width);
    None: causal); `layers` KV layers written; `dtype` the KV's (and the mask's); `attends`:
    False for a forward that writes KV but reads no mask (the eager path builds none)."""

    width: int
    layers: int
    dtype: torch.dtype
    valid: torch.Tensor | None = None
    pattern: torch.Tensor | None = None
    attends: bool = True


Call = Callable[..., T]
"""`call(mask, cache, *args)`: one forward, given its additive 4D mask (None: transformers'
causal one) and its cache (a `CacheAdapter`)."""


def backbone_masks(mask: torch.Tensor | None) -> dict[str, torch.Tensor] | None:
    """A `Call`'s mask as a transformers backbone's `attention_mask`: per layer type (so it
    builds none of its own, which a compiled graph over static KV needs), None as is."""
    return None if mask is None else {"full_attention": mask}


class EagerPath:
    """Every forward eager: the chunk opened in the `RaggedKV`, its mask from `chunk_mask`."""

    compiled = False
    compile_s = 0.0
    compiles = 0

    def run(self, call: Call[T], config: object, kv: RaggedKV, chunk: Chunk, *args: object) -> T:
        kv.open_chunk(chunk.valid, chunk.width)
        mask = kv.chunk_mask(chunk.pattern, chunk.dtype) if chunk.attends else None
        return call(mask, CacheAdapter(kv), *args)

    def __deepcopy__(self, memo: dict) -> EagerPath:
        return self


EAGER = EagerPath()


def _static_graph(call: Call[T], lengths: torch.Tensor, real: torch.Tensor, pattern: torch.Tensor,
                  extent: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                  *args: object) -> T:
    """`call` over static KV: the open chunk (the last `pattern.shape[0]` of `real`'s slots after
    each row's `lengths`) written in place, attention over the buffer's first `extent` (S,)
    = 0..S-1 slots under the mask."""
    width = pattern.shape[0]
    allowed = chunk_allowed(lengths, real, pattern, extent)
    slots = lengths.unsqueeze(1) + (real.shape[1] - width) + torch.arange(width, device=real.device)
    store = _StaticKV(keys, values, slots, extent.shape[0])
    return call(additive(allowed, keys[0].dtype), CacheAdapter(store), *args)


def _bucket(slots: int) -> int:
    """The slots a graph attends over: `slots` rounded up to a multiple of `_BUCKET` (its size is
    symbolic in the graph, so a new bucket compiles nothing; the whole capacity would cost a
    chunk's attention up to twice the slots in use)."""
    return -(-slots // _BUCKET) * _BUCKET


class FastPath:
    """The compiled forwards of one device (shared by the requests of a decoder)."""

    compiled = True

    def __init__(self, device: torch.device) -> None:
        mode = "reduce-overhead" if device.type == "cuda" else None
        self._graph = torch.compile(_static_graph, mode=mode, dynamic=True)
        self.device = device
        self.compile_s = 0.0  # wall time of the calls that compiled a graph (not steady state)
        self.compiles = 0
        self._extents: dict[int, torch.Tensor] = {}
        # a graph per (call, model, batch 1 or more, width 1 or more) of every arm: dynamo allows 8
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, _GRAPHS)
        # sizes equal by chance at a compile stay distinct symbols, else they would be guarded
        # equal and recompile when they part
        shape_config.use_duck_shape = False

    def run(self, call: Call[T], config: object, kv: RaggedKV, chunk: Chunk, *args: object) -> T:
        """`call` compiled over `kv`'s rows (its buffers grown to hold the chunk first); the chunk
        is recorded in `kv` as an eager forward's is (the caller `commit`s or `drop`s). Eager
        when `kv` lacks a layer the forward writes (its first write sizes the buffers)."""
        if len(kv.keys) < chunk.layers:
            return EAGER.run(call, config, kv, chunk, *args)
        kv.open_chunk(chunk.valid, chunk.width)
        extent = _bucket(max(kv.lengths) + kv.appended)
        kv.reserve(extent + 1)  # a spare slot: a graph is compiled for slots seen < capacity
        pattern = own_pattern(chunk.pattern, chunk.width, kv.device)
        graphs, start = counters["stats"]["unique_graphs"], time.perf_counter()
        attention = getattr(config, "_attn_implementation")
        setattr(config, "_attn_implementation", _ATTENTION)
        try:
            out = self._graph(call, kv.lengths_tensor(), kv.appended_real(), pattern,
                              self._slot_ids(extent), kv.keys, kv.values, *args)
        finally:
            setattr(config, "_attn_implementation", attention)
        if counters["stats"]["unique_graphs"] != graphs:
            elapsed = time.perf_counter() - start
            self.compile_s += elapsed
            self.compiles += 1
            log.info("fast path: compiled %s for batch %d, width %d, capacity %d in %.1f s",
                     call.__name__, kv.size, chunk.width, kv.keys[0].shape[2], elapsed)
        return out

    def _slot_ids(self, extent: int) -> torch.Tensor:
        """0..extent-1 on the device (kept: one per bucket)."""
        if extent not in self._extents:
            self._extents[extent] = torch.arange(extent, device=self.device)
        return self._extents[extent]

    def __deepcopy__(self, memo: dict) -> FastPath:
        return self  # a device's graphs: shared, never copied with a state


ForwardPath = EagerPath | FastPath
FastPathSetting = bool | Literal["auto"]
"""`decoding.fast_path`: on, off, or "auto": on for CUDA (CUDA graphs, what SGLang and vLLM
run), off elsewhere (`fast_path_on`)."""


def fast_path_on(setting: FastPathSetting, device: torch.device) -> bool:
    """Whether `setting` puts a decoder on `device` on the fast path ("auto": CUDA only)."""
    if setting == "auto":
        return device.type == "cuda"
    return bool(setting)
