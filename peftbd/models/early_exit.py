"""Early-exit PEFT-BD: a drafter that runs only the first k layers of the shared backbone.

Beyond the paper. PEFT-BD is slow because a draft forward runs the whole backbone, as expensive
as a verify forward. An early-exit adapter (`peftbd.draft_layers = k`) has its LoRA in layers
0..k-1 only (peft's `layers_to_transform`, saved with the adapter), and drafting runs the chunk
through those k layers against their verifier (adapter-off) KV, then the backbone's final norm
and the tied LM head. Layers k..L-1 are skipped and their KV is never touched, so a draft costs
about k/L of the backbone plus the LM head, and needs no state beyond the verifier's cache.
Training (`peftbd.training.block_diffusion`) runs the same truncated forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from peft import PeftModel
from transformers import Cache, PretrainedConfig


def early_exit_layers(draft_layers: int) -> list[int] | None:
    """peft's `layers_to_transform` for `peftbd.draft_layers` (None: every layer)."""
    return list(range(draft_layers)) if draft_layers > 0 else None


def adapter_depth(peft_model: PeftModel) -> int:
    """How many leading layers the model's active drafter adapter drafts with (all for a
    whole-backbone adapter)."""
    layers = peft_model.peft_config[peft_model.active_adapter].layers_to_transform
    total = peft_model.get_base_model().config.num_hidden_layers
    if layers is None:
        return total
    layers = [layers] if isinstance(layers, int) else sorted(layers)
    if layers != list(range(len(layers))) or len(layers) > total:
        raise ValueError(
            f"adapter layers_to_transform={layers}: an early-exit drafter adapts the first k "
            f"layers (0..k-1 of {total}); train it with --set peftbd.draft_layers=k"
        )
    return len(layers)


@contextlib.contextmanager
def first_layers(config: PretrainedConfig, depth: int | None) -> Iterator[None]:
    """Run a block with the backbone cut to its first `depth` layers (transformers' decoder loop
    runs `layers[: config.num_hidden_layers]`; None: all of them); restored afterwards."""
    full = config.num_hidden_layers
    config.num_hidden_layers = full if depth is None else min(depth, full)
    try:
        yield
    finally:
        config.num_hidden_layers = full


def crop_first_layers(cache: Cache, tokens: int, depth: int) -> None:
    """Remove the last `tokens` positions from the first `depth` layers of `cache` (those a
    truncated forward extended)."""
    for layer in cache.layers[:depth]:
        layer.crop(-tokens)
