"""The block-diffusion head's objective: PEFT-BD's blocks, drafted by the head from the frozen
verifier's features (`peftbd.models.bd_head`).

The verifier (no grad) runs once over each clean sequence and yields the features of every
position. Blocks are cut exactly as for PEFT-BD (`peftbd.training.block_diffusion`) at the
engine's offsets (`random`: a random offset per row and epoch, so every position after the
prompt is a block start over the epochs) and fully masked (t = 1: the head drafts in one step,
so it is trained on what it sees when drafting). The head injects the context KV of every
position once (c_i at position i), then runs all block chunks of a row as one query sequence
whose 4D mask gives chunk k the context columns 0..s_k-2 and its own chunk, chunk k's first token
fused with c_{s_k-2}: for each block, exactly the engine's draft forward (a test compares them).
The loss is PEFT-BD's linear-prefix loss (`prefix_gamma`) or DFlash's exponential decay
(`loss_decay`) over the block positions, through the verifier's LM head, `chunk_rows` positions
at a time. Where blocks start and how many positions they draft is the task's
(`peftbd.training.head_task`).

Eval replays the engine's rounds on the rows (`peftbd.training.rounds`) with `head_drafts`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from peftbd.models.bd_head import BDHead, DraftVocabulary
from peftbd.training.block_diffusion import BlockStats, DraftBatch, block_stats
from peftbd.training.examples import SequenceBatch
from peftbd.training.rounds import Drafts, round_draft_batch


@torch.no_grad()
def verifier_features(verifier: PreTrainedModel, ids: torch.Tensor,
                      layers: tuple[int, ...]) -> torch.Tensor:
    """Float (B, L, m*d): the verifier's hidden states `layers` of `ids`, concatenated (right
    padding is harmless under causal attention)."""
    out = verifier.model(input_ids=ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[k] for k in layers], -1)


@dataclass(frozen=True)
class HeadContext:
    """The projected context of every position of a batch and its KV in the head's cache."""

    context: torch.Tensor  # (B, L, d)
    cache: DynamicCache


def head_context(head: BDHead, features: torch.Tensor) -> HeadContext:
    """The head's context of every position of `features` (B, L, m*d), and its KV."""
    context = head.context(features)
    cache = DynamicCache(config=head.config)
    positions = torch.arange(features.shape[1], device=features.device).expand(features.shape[0], -1)
    head.add_context(context, positions, cache)
    return HeadContext(context, cache)


def head_chunk_hidden(head: BDHead, draft: DraftBatch, ctx: HeadContext) -> torch.Tensor:
    """(B, K*(D+1), d): the head's hidden states of every chunk of `draft` over the context KV
    in `ctx` (left as it was); chunk k's first token at position s-1 is fused with c_{s-2}."""
    anchors = draft.chunk_positions[:, :: draft.block_size + 1]  # (B, K): each chunk's s - 1
    index = (anchors - 1).clamp_min(0)  # dummy chunks sit at 0 (they carry no loss)
    anchor = ctx.context.gather(1, index.unsqueeze(-1).expand(-1, -1, ctx.context.shape[-1]))
    hidden = head.block_hidden(draft.chunk_ids, draft.chunk_positions,
                               draft.attention_mask.to(head.mask_embedding.dtype), ctx.cache,
                               anchor=anchor)
    ctx.cache.crop(-draft.chunk_ids.shape[1])
    return hidden


def head_block_stats(head: BDHead, verifier: PreTrainedModel, draft: DraftBatch,
                     chunk_rows: int = 0) -> BlockStats:
    """Loss and accuracy sums of `draft` drafted by the head (the loss keeps its graph)."""
    features = verifier_features(verifier, draft.clean_ids, head.shape.feature_layers)
    hidden = head_chunk_hidden(head, draft, head_context(head, features))
    return block_stats(hidden, draft, head.logits, chunk_rows)


def head_drafts(head: BDHead, verifier: PreTrainedModel, batch: SequenceBatch, *,
                block_size: int, pad_id: int, vocab: DraftVocabulary | None = None) -> Drafts:
    """The head's drafts of `batch`'s replayed rounds against their context KV (computed once),
    over the whole vocabulary or `vocab` (`BDHead.draft_vocabulary`)."""
    ctx = head_context(head, verifier_features(verifier, batch.ids, head.shape.feature_layers))

    def drafts(starts: list[list[int]]) -> torch.Tensor:
        draft = round_draft_batch(batch, starts, block_size=block_size, mask_id=head.shape.mask_id,
                                  pad_id=pad_id, anchored=head.shape.anchored, dtype=head.mask_embedding.dtype)
        hidden = draft.block_view(head_chunk_hidden(head, draft, ctx))[:, 0]
        return head.draft_tokens(hidden, vocab).cpu()

    return drafts
