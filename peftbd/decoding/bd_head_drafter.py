"""Block-diffusion head drafting: the head's own layers denoise a block of masks in one forward,
conditioned on the verifier's hidden states of the context (`peftbd.models.bd_head`).

KV choice: the head keeps its own cache per request (`state.drafter_state`): per head layer, the
context KV of every committed position but the last, exactly the positions of the verifier's
cache. Each round first injects the context KV of the positions the last verify (or prefill)
cached, from their features in `state.features`; then one forward over the chunk
`[last committed token, D masks]` (the token's input fused with the last cached position's
context) proposes D tokens, and the chunk's KV is cropped off. The
drafter never reads the verifier's KV (`kv_layers = 0`): a split drafter replica needs only the
committed tokens and the new positions' features.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from peftbd.decoding.state import DecodeState
from peftbd.models.bd_head import BDHead
from peftbd.models.peft_bd import draft_attention_mask, draft_input_ids, draft_position_ids


class BDHeadDrafter:
    """The block-diffusion head drafter: one forward of the head per round, D = `block_size`
    tokens; `vocab_ids` (N,) restricts the draft LM head to those tokens (FR-Spec)."""

    name = "peftbd_head"
    kv_layers = 0  # reads `state.features`, never the verifier's KV

    def __init__(self, head: BDHead, verifier: PreTrainedModel, block_size: int,
                 vocab_ids: torch.Tensor | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block_size={block_size}; drafter.block_size must be >= 1 (paper: 16)")
        head.bind(verifier)  # share this verifier's embeddings and LM head
        self.head = head.eval()
        self.vocab = None if vocab_ids is None else head.draft_vocabulary(vocab_ids)
        self.block_size = block_size
        self.feature_layers = tuple(head.shape.feature_layers)

    def start(self, state: DecodeState) -> None:
        if state.feature_layers != self.feature_layers:
            raise ValueError(
                f"the request keeps verifier features {state.feature_layers} but the head reads "
                f"{self.feature_layers}: prefill with feature_layers=drafter.feature_layers "
                "(SpeculativeDecoder.start does)"
            )
        state.drafter_state = DynamicCache(config=self.head.config)

    @torch.inference_mode()
    def propose(self, state: DecodeState, max_tokens: int) -> torch.Tensor:
        cache: DynamicCache = state.drafter_state
        n, length = state.features.shape[1], len(state.tokens)
        cached = cache.get_seq_length()
        if length - 1 - cached != n:
            raise RuntimeError(
                f"head cache holds {cached} positions but {length - 1} are committed and "
                f"state.features covers {n}: call propose exactly once per verify"
            )
        if max_tokens <= 0:
            return torch.empty(1, 0, dtype=torch.long, device=state.device)
        d, dtype = self.block_size, self.head.mask_embedding.dtype
        with state.forwards.timed("draft"):
            positions = torch.arange(cached, cached + n, device=state.device).unsqueeze(0)
            context = self.head.context(state.features)
            self.head.add_context(context, positions, cache)
            hidden = self.head.block_hidden(
                draft_input_ids(state.tokens[-1], self.head.shape.mask_id, d, state.device),
                draft_position_ids(length - 1, d, state.device),
                draft_attention_mask(length - 1, d, False, dtype, state.device), cache,
                anchor=context[:, -1:],  # the last cached position: the one that predicted b
            )
            block = self.head.draft_tokens(hidden[:, 1:], self.vocab)
        cache.crop(-(d + 1))  # the chunk: the cache holds the committed context again
        return block[:, :max_tokens]
