"""PEFT-BD drafting: the adapter-on backbone denoises a block of masks against the verifier's KV.

The chunk layout, positions and attention pattern are `peftbd.models.peft_bd`'s (shared with
training). A batch of requests drafts in one forward per denoising step, the rows' verifier
caches packed (`peftbd.decoding.ragged`); the draft's KV is dropped after every forward. An early-exit
adapter (`peftbd.models.early_exit`) drafts through its first k layers only. `propose_ahead`
drafts the next round while this one verifies (`peftbd.decoding.ahead`).

Unmasking rule for `denoise_steps = S > 1` (MaskGIT-style, linear schedule): after step s the
ceil(D * s / S) most confident positions are fixed (confidence = the max softmax probability,
taken among positions not yet fixed); the others are re-masked and predicted again by the next
step, which sees the fixed tokens in place; the last step fills every remaining position. With
S = 2 that is "keep the most confident half, re-predict the rest". The mask token is never
proposed (its logit is excluded from the argmax), so the draft reads its logits from the base
output projection and gathers its input embeddings itself (`draft_logits`, `draft_embeddings`):
the same values without peft's per-forward copy of both vocab x hidden matrices. The adapted
Linears run as plain matmuls (`lean_lora`): the same values without peft's per-call bookkeeping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from peft import PeftModel
from transformers import PreTrainedModel

from peftbd.decoding.ahead import PreDraft, ahead_pattern
from peftbd.decoding.cache_adapter import CacheAdapter
from peftbd.decoding.fast_path import Chunk, backbone_masks
from peftbd.decoding.drafter import no_draft
from peftbd.decoding.ragged import pack
from peftbd.decoding.state import DecodeState, timed
from peftbd.decoding.verify import unwrap
from peftbd.models.early_exit import adapter_depth, first_layers
from peftbd.models.lean_lora import lean_lora
from peftbd.models.peft_bd import (
    adapter_on,
    draft_embeddings,
    draft_input_ids,
    draft_logits,
    draft_position_ids,
    draft_visibility,
)


def _draft_call(mask: torch.Tensor | None, cache: CacheAdapter, base: PreTrainedModel,
                chunk: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One adapter-on denoising forward over `chunk` (B, D + 1) = [b, block] (a
    `peftbd.decoding.fast_path.Call`): the logits (B, D, V) of the block's positions."""
    out = base.model(inputs_embeds=draft_embeddings(base, chunk), cache=cache,
                     position_ids=positions, attention_mask=backbone_masks(mask), use_cache=True)
    return draft_logits(base, out.last_hidden_state[:, 1:])


class PeftBDDrafter:
    """The PEFT-BD drafter: `peft_model` is the verifier with the drafter adapter attached (the
    same object verifies with the adapter off)."""

    name = "PEFT-BD drafter"
    reads_hidden = False
    feature_layers: tuple[int, ...] = ()
    draft_on_path = True  # its forwards run through `state.path` (compiled on the fast path)

    def __init__(self, peft_model: PeftModel, mask_id: int, block_size: int,
                 denoise_steps: int = 1, anchored: bool = False) -> None:
        if block_size < 1:
            raise ValueError(f"block_size={block_size}; peftbd.block_size must be >= 1 (paper: 16)")
        if not 1 <= denoise_steps <= block_size:
            raise ValueError(
                f"denoise_steps={denoise_steps}; peftbd.denoise_steps must be in 1..block_size "
                f"({block_size})"
            )
        self.model = peft_model
        self.depth = adapter_depth(peft_model)  # all layers, or an early-exit adapter's k
        total = unwrap(peft_model).config.num_hidden_layers
        self.reads_kv_layers = self.depth if self.depth < total else None  # None: every layer
        self.mask_id = mask_id
        self.block_size = block_size
        self.denoise_steps = denoise_steps
        self.anchored = anchored

    def start(self, state: DecodeState) -> None:
        state.drafter_state = None  # drafts against the verifier's own cache: no state of its own

    @torch.inference_mode()
    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        live = [i for i, m in enumerate(max_tokens) if m > 0]
        drafts = [no_draft(s) for s in states]
        if not live:
            return drafts
        rows_of = [states[i] for i in live]
        base, d, steps = unwrap(self.model), self.block_size, self.denoise_steps
        device, path = rows_of[0].device, rows_of[0].path
        kv = pack([s.cache for s in rows_of])
        chunk = torch.cat([draft_input_ids(s.tokens[-1], self.mask_id, d, device) for s in rows_of])
        positions = torch.cat([draft_position_ids(n, d, device) for n in kv.lengths])
        pattern = draft_visibility(0, d, self.anchored)
        block = chunk[:, 1:].clone()
        fixed = torch.zeros_like(block, dtype=torch.bool)
        with adapter_on(self.model), lean_lora(self.model), first_layers(base.config, self.depth):
            chunk_of = Chunk(d + 1, base.config.num_hidden_layers, base.dtype, pattern=pattern)
            for step in range(1, steps + 1):
                with timed(rows_of, "draft"):
                    logits = path.run(_draft_call, base.config, kv, chunk_of, base, chunk,
                                      positions).float()
                kv.drop()
                logits[..., self.mask_id] = -math.inf
                if step == steps:
                    block = torch.where(fixed, block, logits.argmax(-1))
                    break
                conf, pred = logits.log_softmax(-1).max(-1)
                n_new = math.ceil(d * step / steps) - math.ceil(d * (step - 1) / steps)
                idx = conf.masked_fill(fixed, -math.inf).topk(n_new, dim=-1).indices
                block.scatter_(1, idx, pred.gather(1, idx))
                fixed.scatter_(1, idx, True)
                chunk[:, 1:] = torch.where(fixed, block, self.mask_id)
        for row, i in enumerate(live):
            drafts[i] = block[row : row + 1, : max_tokens[i]]
        return drafts

    @torch.inference_mode()
    def propose_ahead(self, states: Sequence[DecodeState], drafts: Sequence[Sequence[int]],
                      accepted: Sequence[int], max_tokens: Sequence[int]) -> list[PreDraft]:
        """Round r+1 drafted while round r verifies (`peftbd.decoding.ahead`): per state, up to
        min(D - 1, max_tokens[i]) tokens after `accepted[i]` tokens of `drafts[i]` and the
        bonus; one adapter-on forward per distinct accepted length. Each state's cache is left
        as it was."""
        base, d = unwrap(self.model), self.block_size
        out: dict[int, PreDraft] = {}
        by_k: dict[int, list[int]] = {}
        for i, k in enumerate(accepted):
            by_k.setdefault(k, []).append(i)
        with adapter_on(self.model), lean_lora(self.model), first_layers(base.config, self.depth):
            for k, idx in by_k.items():
                rows = [states[i] for i in idx]
                device, clean = rows[0].device, k + 1
                kv = pack([s.cache for s in rows])
                chunk = torch.full((len(rows), clean + d), self.mask_id, dtype=torch.long,
                                   device=device)
                for r, i in enumerate(idx):
                    chunk[r, :clean] = torch.tensor([states[i].tokens[-1], *drafts[i][:k]],
                                                    device=device)
                positions = torch.stack([torch.arange(n, n + clean + d, device=device)
                                         for n in kv.lengths])
                spec = Chunk(clean + d, base.config.num_hidden_layers, base.dtype,
                             pattern=ahead_pattern(clean, d, self.anchored, device))
                with timed(rows, "ahead"):
                    logits = rows[0].path.run(_draft_call, base.config, kv, spec, base, chunk,
                                              positions)[:, k:].float()  # the masks' logits
                kv.drop()
                logits[..., self.mask_id] = -math.inf
                tokens = logits[:, 1:].argmax(-1)  # after the bonus's mask
                for r, i in enumerate(idx):
                    out[i] = PreDraft(k, tokens[r : r + 1, : max(max_tokens[i], 0)])
        return [out[i] for i in range(len(states))]
