"""Block-diffusion head drafting: the head's own layers denoise a block of masks in one forward,
conditioned on the verifier's hidden states of the context (`peftbd.models.bd_head`).

KV choice: the head keeps its own cache per request (`state.drafter_state`): per head layer, the
context KV of every committed position but the last, exactly the positions of the verifier's
cache. Each round first injects the context KV of the positions the last verify (or prefill)
cached, from their features in `state.features`; then one forward over the chunk
`[last committed token, K masks]` (the token's input fused with the last cached position's
context) proposes K tokens, and the chunk's KV is dropped: K = D, or D - 1 for a head whose
`block_masks` is block_minus_one (DFlash's block of D positions, the token's included). A batch
of requests drafts in one forward, the rows' head caches packed (`peftbd.decoding.ragged`). The
drafter never reads the verifier's KV (`reads_kv_layers = 0`): a split drafter replica needs only
the committed tokens and the new positions' features.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from peftbd.decoding.cache_adapter import CacheAdapter
from peftbd.decoding.drafter import no_draft
from peftbd.decoding.fast_path import Chunk
from peftbd.decoding.ragged import RaggedKV, RowCache, pack
from peftbd.decoding.row_batch import left_aligned, padded_ids
from peftbd.decoding.state import DecodeState, drafter_cache, present, timed
from peftbd.models.bd_head import BDHead, DraftVocabulary
from peftbd.models.peft_bd import draft_input_ids, draft_position_ids, draft_visibility


def _add_context(mask: torch.Tensor | None, cache: CacheAdapter, head: BDHead,
                 features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The context (B, n, d) of verifier `features`, its KV injected at `positions` (a
    `peftbd.decoding.fast_path.Call` that reads no mask)."""
    context = head.context(features)
    head.add_context(context, positions, cache)
    return context


def _block_tokens(mask: torch.Tensor | None, cache: CacheAdapter, head: BDHead, chunk: torch.Tensor,
                  positions: torch.Tensor, anchor: torch.Tensor,
                  vocab: DraftVocabulary | None) -> torch.Tensor:
    """The head's forward over the chunks (a `Call`): the draft tokens (B, D) of their masks."""
    assert mask is not None  # a draft pattern is always a mask of its own
    hidden = head.block_hidden(chunk, positions, mask, cache, anchor=anchor)
    return head.draft_tokens(hidden[:, 1:], vocab)


class BDHeadDrafter:
    """The block-diffusion head drafter: one forward of the head per round, `block_size` =
    `head.shape.drafted(block_size)` tokens (D, or D - 1: see module doc); `vocab_ids` (N,)
    restricts the draft LM head to those tokens (FR-Spec)."""

    name = "block-diffusion head drafter"
    reads_kv_layers: int | None = 0  # reads `state.features`, never the verifier's KV
    reads_hidden = False
    draft_on_path = True  # its forwards run through `state.path` (compiled on the fast path)

    def __init__(self, head: BDHead, verifier: PreTrainedModel, block_size: int,
                 vocab_ids: torch.Tensor | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block_size={block_size}; peftbd.block_size must be >= 1 (paper: 16)")
        head.bind(verifier)  # share this verifier's embeddings and LM head
        self.head = head.eval()
        self.pool = RaggedKV([], next(head.parameters()).device)  # the head's KV: a row per request
        self.vocab = None if vocab_ids is None else head.draft_vocabulary(vocab_ids)
        self.block_size = head.shape.drafted(block_size)
        self.feature_layers = tuple(head.shape.feature_layers)

    def start(self, state: DecodeState) -> None:
        if state.feature_layers != self.feature_layers:
            raise ValueError(
                f"the request keeps verifier features {state.feature_layers} but the head reads "
                f"{self.feature_layers}: prefill with feature_layers=drafter.feature_layers "
                "(SpeculativeDecoder.start does)"
            )
        state.drafter_state = RowCache.empty(self.pool)

    @torch.inference_mode()
    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        caches = [drafter_cache(s, "the head's cache") for s in states]
        new = [present(s.features, "state.features")[0] for s in states]  # (n_i, m*d) each
        for state, cache, f in zip(states, caches, new):
            n, cached = f.shape[0], cache.get_seq_length()
            if len(state.tokens) - 1 - cached != n:
                raise RuntimeError(
                    f"head cache holds {cached} positions but {len(state.tokens) - 1} are "
                    f"committed and state.features covers {n}: call propose exactly once per verify"
                )
        live = [i for i, m in enumerate(max_tokens) if m > 0]
        drafts = [no_draft(s) for s in states]
        if not live:
            return drafts
        rows_of = [states[i] for i in live]
        device, d, dtype = rows_of[0].device, self.block_size, self.head.mask_embedding.dtype
        kv = pack([caches[i] for i in live])
        counts = [new[i].shape[0] for i in live]
        features, valid = left_aligned([new[i] for i in live])
        positions, _ = padded_ids([range(c, c + n) for n, c in zip(counts, kv.lengths)])
        anchors = torch.tensor([n - 1 for n in counts], device=device)
        chunk = torch.cat([draft_input_ids(s.tokens[-1], self.head.shape.mask_id, d, device)
                           for s in rows_of])
        chunk_positions = torch.cat([draft_position_ids(len(s.tokens) - 1, d, device) for s in rows_of])
        path, head, pattern = rows_of[0].path, self.head, draft_visibility(0, d, self.head.shape.anchored)
        layers = len(head.layers)
        with timed(rows_of, "draft"):
            context = path.run(_add_context, head.config, kv,
                               Chunk(features.shape[1], layers, dtype, None if valid.all() else valid,
                                     attends=False), head, features, positions.to(device))
            # each row's anchor: its last cached position's context, the one that predicted b
            anchor = context[torch.arange(len(rows_of), device=device), anchors].unsqueeze(1)
            block = path.run(_block_tokens, head.config, kv, Chunk(d + 1, layers, dtype, pattern=pattern),
                             head, chunk, chunk_positions, anchor, self.vocab)
        kv.drop()
        kv.commit(counts)  # the committed context again
        for row, i in enumerate(live):
            drafts[i] = block[row : row + 1, : max_tokens[i]]
        return drafts
