"""The generate stage's greedy continuations: the decoding engine's greedy AR
(`SpeculativeDecoder(model, None, ...).decode_many`), with why each one stopped.

The engine's batching does not change tokens: each row attends to its own ragged KV row at its
own positions, so a batch's output equals each prompt decoded alone (up to kernel numerics in
low precision; `scripts/device_check.py` checks bf16 on GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from peftbd.decoding.loop import SpeculativeDecoder


class Continuation(NamedTuple):
    """Generated ids (the stop token included when `finish_reason == "eos"`) and why it stopped."""

    ids: list[int]
    finish_reason: str  # eos | length


def greedy_continuations(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                         max_new_tokens: int, eos_ids: Sequence[int], *,
                         batch_size: int | None = None) -> list[Continuation]:
    """Greedy continuations of `prompts` (stop at any of `eos_ids` or after `max_new_tokens`),
    at most `batch_size` rows at a time with continuous batching (None: all at once)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    if not prompts:
        return []
    stop = set(eos_ids)
    results = SpeculativeDecoder(model, None, eos_ids, max_new_tokens).decode_many(
        prompts, batch_size or len(prompts))
    return [Continuation(r.tokens, "eos" if r.tokens[-1] in stop else "length") for r in results]
