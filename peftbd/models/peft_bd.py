"""The PEFT-BD drafter: a LoRA adapter on the verifier's own backbone, plus the draft pattern.

The adapter (LoRA on every linear projection + one trainable mask-token embedding row) turns the
verifier into a block drafter when it is switched on and is bit-identical to the verifier when it
is switched off (`set_adapter_enabled`).

**KV convention (project-wide, shared by training and decoding): the drafter drafts against the
verifier's adapter-off KV cache.** The cache holds the verifier's KV of the committed tokens
x_1..x_{t-1}; the last committed token b = x_t is not in it. One draft forward runs with the
adapter ON over the chunk `[b, m_1..m_D]` (m = mask token) at positions t..t+D. Every chunk
position attends to the whole cache. Within the chunk:

- unanchored (default): b is causal context (it sees the cache and itself); the D masks see the
  cache, b and each other (bidirectional);
- anchored: b is inside the bidirectional block too (it also sees the masks).

The logits at chunk position i >= 1 predict the token at that same position, x_{t+i} (no shift),
so a draft forward proposes D tokens. The chunk's adapter-on KV is cropped off the cache right
after the forward: the verifier cache never keeps adapter-on KV. Training builds its inputs with
`draft_input_ids` / `draft_position_ids` / `draft_attention_mask`, so both sides share one pattern.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils.other import AuxiliaryTrainingWrapper
from torch import nn
from transformers import PreTrainedModel

from peftbd.config import DrafterConfig
from peftbd.models.early_exit import early_exit_layers
from peftbd.models.flat import flat
from peftbd.models.lean_lora import forget

_TOGGLES = "_peftbd_adapter_toggles"
ADAPTER_SUBDIR = "adapter"
"""Where a PEFT-BD training run (jobs.train --method peftbd) puts the adapter under its output dir."""


def draft_visibility(cache_len: int, block_size: int, anchored: bool, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool (1 + block_size, cache_len + 1 + block_size): True where a chunk query may attend.

    Rows are the chunk `[b, m_1..m_D]`; columns are `[cache | chunk]`. See the module docstring.
    """
    if cache_len < 0 or block_size < 1:
        raise ValueError(
            f"draft_visibility: cache_len={cache_len}, block_size={block_size}; "
            "need cache_len >= 0 and block_size >= 1"
        )
    chunk = 1 + block_size
    visible = torch.ones(chunk, cache_len + chunk, dtype=torch.bool, device=device)
    if not anchored:
        visible[0, cache_len + 1 :] = False  # b is causal: it does not see the masks
    return visible


def draft_attention_mask(
    cache_len: int,
    block_size: int,
    anchored: bool,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    batch_size: int = 1,
) -> torch.Tensor:
    """Additive float mask (batch, 1, 1 + block_size, cache_len + 1 + block_size) for a draft chunk.

    0 where attention is allowed, `finfo(dtype).min` elsewhere; transformers passes a 4D mask
    through as is, and both eager (adds it) and SDPA (float mask) accept this form.
    """
    visible = draft_visibility(cache_len, block_size, anchored, device)
    mask = torch.zeros(visible.shape, dtype=dtype, device=device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask.expand(batch_size, 1, *visible.shape)


def draft_input_ids(
    bonus_id: int, mask_id: int, block_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Long (1, 1 + block_size): the chunk `[b, m_1..m_D]`."""
    ids = torch.full((1, 1 + block_size), mask_id, dtype=torch.long, device=device)
    ids[0, 0] = bonus_id
    return ids


def draft_position_ids(cache_len: int, block_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Long (1, 1 + block_size): positions t..t+D of the chunk, t = cache_len (0-based)."""
    return torch.arange(cache_len, cache_len + 1 + block_size, device=device).unsqueeze(0)


def lora_config(drafter_cfg: DrafterConfig, mask_token_id: int) -> LoraConfig:
    """The drafter's LoRA config: r/alpha/dropout/targets from `cfg.peftbd`, trainable mask row."""
    return LoraConfig(
        r=drafter_cfg.lora_r,
        lora_alpha=drafter_cfg.lora_alpha,
        lora_dropout=drafter_cfg.lora_dropout,
        target_modules=list(drafter_cfg.target_modules),
        layers_to_transform=early_exit_layers(drafter_cfg.draft_layers),
        layers_pattern="layers" if drafter_cfg.draft_layers else None,
        trainable_token_indices={"embed_tokens": [mask_token_id]},
        bias="none",
        task_type="CAUSAL_LM",
    )


def attach_drafter_adapter(
    model: PreTrainedModel, drafter_cfg: DrafterConfig, mask_token_id: int
) -> PeftModel:
    """Wrap the verifier with a fresh (untrained) drafter adapter, switched off (the model rests
    as the verifier; drafting and training switch it on); only adapter weights train.

    With tied embeddings (the tiny verifier, Qwen3-0.6B), peft 0.21 also wraps `lm_head` with a
    token adapter tied to the embedding's, so the mask row is shared by input and output exactly
    as the base weights are; with the adapter off both use the original row.
    """
    vocab, depth = model.get_input_embeddings().num_embeddings, model.config.num_hidden_layers
    if not 0 <= drafter_cfg.draft_layers <= depth:
        raise ValueError(
            f"peftbd.draft_layers={drafter_cfg.draft_layers}: the verifier has {depth} layers; "
            f"use 0 (the whole backbone drafts) or 1..{depth} (early exit after that many)"
        )
    if not 0 <= mask_token_id < vocab:
        raise ValueError(
            f"mask_token_id={mask_token_id} is outside the embedding table ({vocab} rows); "
            "load the tokenizer with peftbd.models.loading.load_tokenizer, which adds <|mask|>"
        )
    peft_model = get_peft_model(model, lora_config(drafter_cfg, mask_token_id))
    _register_toggles(peft_model)
    set_adapter_enabled(peft_model, False)  # at rest the model is the verifier; drafting opts in
    return peft_model


def load_drafter_adapter(model: PreTrainedModel, peftbd_dir: str | Path, is_trainable: bool = False) -> PeftModel:
    """Load a saved drafter adapter (`PeftModel.save_pretrained` output, or the output dir of a
    PEFT-BD training run, which holds it in `adapter/`) onto the verifier, switched off (the
    model rests as the verifier; drafting switches it on)."""
    peftbd_dir = Path(peftbd_dir)
    if not (peftbd_dir / "adapter_config.json").is_file():
        peftbd_dir = peftbd_dir / ADAPTER_SUBDIR
    if not (peftbd_dir / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"peftbd_dir={str(peftbd_dir.parent)!r} holds no adapter_config.json, nor does its "
            f"{ADAPTER_SUBDIR}/; pass the output dir of jobs.train --method peftbd or a directory saved "
            "with PeftModel.save_pretrained"
        )
    peft_model = PeftModel.from_pretrained(model, str(peftbd_dir), is_trainable=is_trainable)
    _register_toggles(peft_model)
    set_adapter_enabled(peft_model, False)  # at rest the model is the verifier; drafting opts in
    return peft_model


def _register_toggles(model: nn.Module) -> list[nn.Module]:
    forget(model)  # adapters were attached or loaded: lean forwards are rebuilt on next use
    toggles = [
        m for m in model.modules() if isinstance(m, (BaseTunerLayer, AuxiliaryTrainingWrapper))
    ]
    object.__setattr__(model, _TOGGLES, toggles)  # a plain attribute, not a submodule
    return toggles


def set_adapter_enabled(model: nn.Module, enabled: bool) -> None:
    """Switch every adapter layer (LoRA and the mask-token row) on or off in O(#layers) flag sets.

    Bit-identical to `with model.disable_adapter():` but without its per-call module walk
    (~7-15 ms); the list of adapter layers is collected once per model.
    """
    toggles = getattr(model, _TOGGLES, None)
    if toggles is None:
        toggles = _register_toggles(model)
    for module in toggles:
        vars(module)["_disable_adapters"] = not enabled  # a plain flag: skip nn.Module.__setattr__


@contextlib.contextmanager
def adapter_on(model: nn.Module) -> Iterator[None]:
    """Run a block with the adapter on (drafter mode); it is switched off again afterwards.

    The engine's resting state is adapter OFF (verifier mode).
    """
    set_adapter_enabled(model, True)
    try:
        yield
    finally:
        set_adapter_enabled(model, False)


def draft_embeddings(model: PreTrainedModel, input_ids: torch.Tensor) -> torch.Tensor:
    """Adapter-on input embeddings of `input_ids`: the base table's rows with the adapter's
    trained token rows (the mask token) in place. Identical to the wrapped embedding's output, but
    without peft's per-forward copy of the whole table (vocab x hidden: 311 MB at Qwen3-0.6B in
    bf16, most of a tiny model's draft-over-verify overhead on CPU)."""
    emb = model.get_input_embeddings()
    layer = getattr(emb, "token_adapter", None)
    if layer is None or layer.disable_adapters:
        return emb(input_ids)
    out = nn.functional.embedding(input_ids, layer.base_layer.weight)
    for name in layer.active_adapters:
        delta = layer.trainable_tokens_delta[name].to(out.dtype)
        for row, token in enumerate(layer.token_indices[name]):
            out[input_ids == token] = delta[row]
    return out


def draft_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """Logits of `hidden` from the base output projection, skipping the token adapter of a tied
    `lm_head`: its adapted rows (the mask token) are the only ones that differ, and a draft never
    proposes the mask token (its logit is excluded), so drafts are identical and skip peft's
    per-forward copy of the whole output matrix."""
    head = model.get_output_embeddings()
    layer = getattr(head, "token_adapter", None)
    return flat(head if layer is None else layer.base_layer, hidden)


def adapted_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """Adapter-on logits of `hidden`: the base output rows, with the adapter's trained token rows
    (the tied mask row) in place, whatever the adapter switch says (so a recomputation in
    backward, after `adapter_on` has ended, computes the same). The same values as the wrapped
    `lm_head` with the adapter on, and the same gradient of those rows, without peft's
    per-forward copy of the whole vocab x hidden matrix, so training can call it once per chunk
    of positions. Unlike `draft_logits`, the mask token's own logit is the adapted one
    (training's loss covers it)."""
    head = model.get_output_embeddings()
    layer = getattr(head, "token_adapter", None)
    if layer is None:
        return head(hidden)
    base = layer.base_layer
    out = base(hidden)
    for name in layer.active_adapters:
        index = torch.tensor(layer.token_indices[name], device=out.device)
        bias = None if base.bias is None else base.bias[index]
        rows = nn.functional.linear(hidden, layer.trainable_tokens_delta[name].to(hidden.dtype), bias)
        out = out.index_copy(-1, index, rows.to(out.dtype))
    return out


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts; shared (tied) tensors count once."""
    seen: set[int] = set()
    trainable = total = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total
