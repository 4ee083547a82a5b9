"""The fast path (`decoding.fast_path`): the verify forward (the AR step and the verify over
[bonus, d_1..d_k]) as one `torch.compile`d graph over static KV.

Static KV: the graph writes each row's chunk into its `RaggedKV` buffers at the row's own offset
and attends over the whole buffer (its capacity) under a mask it builds itself from the rows'
lengths, so its shapes (batch, chunk width, capacity) never change with each token. They are
compiled dynamic: a graph each for batch 1 and B > 1 times width 1 (AR) and k + 1 (torch
specializes sizes of 1); fixed shapes (`dynamic=False`) recompiled at every capacity growth and
batch change (7 graphs, 165 s, for one AR pass at batch 1 and 16 on the 2-core box). Inductor on
CPU; CUDA graphs (`mode="reduce-overhead"`) on CUDA. Compile time is kept apart from steady
state (`compile_s`, one log line per compile). Prefill, the drafters' forwards and catching a
state up stay eager, and so does a verify that keeps verifier features (`feature_layers`).
Tokens equal eager's; logits need not be bit-identical (fused kernels round differently). A batch
with sampled rows runs the same graph: their logits come from its hidden states through the eager
LM head (`peftbd.decoding.verify.choose`).
"""

from __future__ import annotations

import logging
import time

import torch
from torch._dynamo.utils import counters
from torch.nn import functional as F
from transformers import AttentionInterface, PreTrainedModel

from peftbd.decoding.cache_adapter import CacheAdapter
from peftbd.decoding.ragged import RaggedKV

log = logging.getLogger(__name__)

_ATTENTION = "peftbd_gqa_sdpa"


def _gqa_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor, scaling: float | None = None, **kwargs: object
              ) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention (inference, a mask given) with grouped KV heads read as they
    are: its compiled form otherwise copies every KV head group out of the whole buffer."""
    groups: int = getattr(module, "num_key_value_groups")
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                         enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(_ATTENTION, _gqa_sdpa)


class _StaticKV:
    """The graph's `KVStore` (`peftbd.decoding.cache_adapter`): write row i's chunk at its
    `slots[i]`, return the whole buffer (the mask says which slots a query sees). `index_put_`,
    which inductor writes in place (a `scatter_` would copy the whole buffer every layer)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], slots: torch.Tensor) -> None:
        self.keys, self.values, self.slots = keys, values, slots

    def write(self, key: torch.Tensor, value: torch.Tensor,
              layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows, heads = (torch.arange(n, device=key.device) for n in key.shape[:2])
        index = (rows.view(-1, 1, 1), heads.view(1, -1, 1), self.slots.unsqueeze(1))  # (B, H, Q)
        self.keys[layer_idx].index_put_(index, key)
        self.values[layer_idx].index_put_(index, value)
        return self.keys[layer_idx], self.values[layer_idx]

    def extent(self) -> tuple[int, int]:
        raise RuntimeError("the fast path passes its own mask: transformers never sizes one")


def _verify_graph(base: PreTrainedModel, ids: torch.Tensor, positions: torch.Tensor,
                  lengths: torch.Tensor, valid: torch.Tensor, keys: list[torch.Tensor],
                  values: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Final hidden states (B, Q, d) and greedy tokens (B, Q) of one chunk per row (row i's at
    slots lengths[i]..; `valid` (B, Q): its real inputs, left-aligned), its KV written in place.
    A query sees its row's committed slots and the real chunk slots up to its own (causal): the
    mask `RaggedKV.chunk_mask` gives a row's single open chunk, over every slot of the buffer."""
    width, capacity = ids.shape[1], keys[0].shape[2]
    rel = torch.arange(capacity, device=ids.device).unsqueeze(0) - lengths.unsqueeze(1)  # (B, C)
    real = (rel < 0) | valid.gather(1, rel.clamp(0, width - 1))
    causal = rel.unsqueeze(1) <= torch.arange(width, device=ids.device).view(1, -1, 1)
    allowed = (real.unsqueeze(1) & causal).unsqueeze(1)  # (B, 1, Q, C)
    dtype = base.dtype
    mask = torch.zeros(allowed.shape, dtype=dtype, device=ids.device)
    mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)
    slots = lengths.unsqueeze(1) + torch.arange(width, device=ids.device)
    out = base.model(input_ids=ids, cache=CacheAdapter(_StaticKV(keys, values, slots)),
                     position_ids=positions, attention_mask={"full_attention": mask}, use_cache=True)
    hidden = out.last_hidden_state
    return hidden, base.lm_head(hidden).argmax(-1)


class FastVerify:
    """The compiled verify forward of one device (shared by the requests of a decoder)."""

    def __init__(self, device: torch.device) -> None:
        mode = "reduce-overhead" if device.type == "cuda" else None
        self._graph = torch.compile(_verify_graph, mode=mode, dynamic=True)
        self.compile_s = 0.0  # wall time of the calls that compiled a graph (not steady state)
        self.compiles = 0

    def __call__(self, base: PreTrainedModel, kv: RaggedKV, ids: torch.Tensor,
                 positions: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`_verify_graph` over `kv`'s rows (its buffers grown to hold the chunk first); the
        chunk is recorded in `kv` as an eager forward's would be (the caller `commit`s)."""
        width = ids.shape[1]
        kv.reserve(max(kv.lengths) + width)
        kv.open_chunk(valid, width)
        graphs, start = counters["stats"]["unique_graphs"], time.perf_counter()
        config, attention = base.config, base.config._attn_implementation
        config._attn_implementation = _ATTENTION
        try:
            out = self._graph(base, ids, positions, kv.lengths_tensor(), valid.to(ids.device),
                              kv.keys, kv.values)
        finally:
            config._attn_implementation = attention
        if counters["stats"]["unique_graphs"] != graphs:
            elapsed = time.perf_counter() - start
            self.compile_s += elapsed
            self.compiles += 1
            log.info("fast path: compiled the verify forward for batch %d, width %d, capacity %d "
                     "in %.1f s", *ids.shape, kv.keys[0].shape[2], elapsed)
        return out
