"""Batched greedy continuation of prompts by the frozen verifier (KV cache, left padding).

Batching must not change tokens: each row gets the positions it would have alone (position ids
count only its real tokens), padded keys are masked out, and a row leaves the batch (its cache
rows dropped) as soon as it stops, so the output equals single-sequence greedy decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from transformers import DynamicCache, PreTrainedModel


class Continuation(NamedTuple):
    """Generated ids (the stop token included when `finish_reason == "eos"`) and why it stopped."""

    ids: list[int]
    finish_reason: str  # eos | length


def left_pad(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids) of `prompts` padded on the left to one length;
    a row's positions count its own tokens from 0 (padding sits at position 0, masked)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device)


@torch.inference_mode()
def greedy_continuations(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
) -> list[Continuation]:
    """Greedy continuations of `prompts` in one batch: stop at any of `eos_ids` or after
    `max_new_tokens` tokens. Finished rows leave the batch, so the work follows live rows."""
    if not prompts:
        return []
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    device = model.device
    stop = set(eos_ids)
    ids, mask, positions = left_pad(prompts, pad_id, device)
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                   use_cache=True, logits_to_keep=1).logits
    next_pos = positions[:, -1:] + 1
    live = list(range(len(prompts)))  # original row of each batch row
    outputs: list[list[int]] = [[] for _ in prompts]
    reasons = ["length"] * len(prompts)
    while True:
        tokens = logits[:, -1].argmax(-1)
        keep = []
        for batch_row, (row, token) in enumerate(zip(live, tokens.tolist())):
            outputs[row].append(token)
            if token in stop:
                reasons[row] = "eos"
            elif len(outputs[row]) < max_new_tokens:
                keep.append(batch_row)
        if not keep:
            break
        if len(keep) < len(live):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask, next_pos, tokens = mask[index], next_pos[index], tokens[index]
            live = [live[i] for i in keep]
        mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
        logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_pos,
                       cache=cache, use_cache=True).logits
        next_pos = next_pos + 1
    return [Continuation(out, reason) for out, reason in zip(outputs, reasons)]
