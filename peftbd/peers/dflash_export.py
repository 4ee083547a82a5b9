"""A block-diffusion head in vLLM's `dflash` drafter format (vLLM's `qwen3_dflash.py`,
`DFlashQwen3ForCausalLM`), so vLLM drafts with the head this project trained:

    speculative_config={"method": "dflash", "model": <out_dir>, "num_speculative_tokens": <n>}

The directory holds `config.json` (the verifier's Qwen3 config at the head's depth and MLP width,
`architectures: ["DFlashDraftModel"]`, DFlash's `block_size` and `dflash_config: {target_layer_ids,
mask_token_id}`), `model.safetensors` (W_c as `fc`, the context norm as `hidden_norm`, the layers
and the final norm under their own names; no embeddings or LM head: vLLM shares the verifier's when
a draft ships none, as our head binds them) and `mask_embedding.pt` (the head's learned mask
embedding, which vLLM puts in place of the mask token's row). vLLM computes a context key as
k_norm(W_k hidden_norm(fc(features))), and a value as W_v hidden_norm(fc(features)), as
`BDHead.add_context` does.

What the format has no place for is refused, naming the field (`DflashExportError`):
- `anchor_fusion` (W_f: vLLM embeds the block's first token plainly, as DFlash does);
- feature layer 0 or L (vLLM reads decoder layers' outputs, its target_layer_ids; the last one
  before the final norm, where transformers' hidden_states[L] is after it);
- `anchored=false` with more than one head layer (the block's first token does not see the
  masks; vLLM's block is non-causal, where it does: the drafts differ once a later layer reads
  that token's output).

Our other methods have no vLLM format: PEFT-BD drafts with the verifier itself, its LoRA adapter
on (vLLM drafts with a separate model; its LoRA support switches adapters per request, not per
forward within a step); FastMTP's shared MTP head reads our verifier's features in our layout
(vLLM's `mtp` method loads a model's own MTP layers); prompt lookup is vLLM's `ngram` (no weights).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from peftbd.errors import UserError
from peftbd.models.bd_head import BDHead

ARCHITECTURE = "DFlashDraftModel"
MASK_FILE = "mask_embedding.pt"
NAMES = {"project.": "fc.", "context_norm.": "hidden_norm."}
"""Our state-dict prefixes that vLLM names otherwise (the layers and `norm` keep theirs)."""


class DflashExportError(UserError, ValueError):
    """The head has something vLLM's dflash format cannot hold (the message names it)."""


@dataclass(frozen=True)
class DflashExport:
    """An exported head: its directory and what vLLM's `speculative_config` needs for it."""

    model_dir: Path
    num_speculative_tokens: int
    target_layer_ids: tuple[int, ...]


def refusals(head: BDHead, section: str) -> list[str]:
    """Why `head` (configured by the `section` config section) cannot run as vLLM's dflash; []
    when it can."""
    shape, depth = head.shape, head.verifier_shape["num_hidden_layers"]
    why = []
    if shape.anchor_fusion:
        why.append(f"{section}.anchor_fusion=true: vLLM's dflash embeds the block's first token "
                   "plainly; train with anchor_fusion=false (DFlash's recipe)")
    edge = [k for k in shape.feature_layers if k in (0, depth)]
    if edge:
        why.append(f"{section}.feature_layers={list(shape.feature_layers)} reads {edge}: vLLM's "
                   f"dflash reads decoder layers' outputs 1..{depth - 1} (the embeddings never, the "
                   f"last layer before the final norm); pick layers in 1..{depth - 1}")
    if shape.layers > 1 and not shape.anchored:
        why.append(f"{section}.anchored=false with layers={shape.layers}: vLLM's dflash block is "
                   "non-causal, so its first token sees the masks, which this head's does not (a "
                   "later layer reads that token's output); train with anchored=true (DFlash's)")
    return why


def export_dflash(head: BDHead, block_size: int, out_dir: str | Path, section: str) -> DflashExport:
    """Write `head` (configured by config section `section`, with its `block_size`) to `out_dir`
    in vLLM's dflash format; raises DflashExportError with every reason it cannot (`refusals`)."""
    why = refusals(head, section)
    if why:
        raise DflashExportError("this head cannot be exported to vLLM's dflash format: " + "; ".join(why))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for name, tensor in head.state_dict().items():
        if name == "mask_embedding":
            continue
        for ours, theirs in NAMES.items():
            if name.startswith(ours):
                name = theirs + name[len(ours):]
        state[name] = tensor.detach().contiguous().cpu()
    save_file(state, str(out / "model.safetensors"))
    torch.save({"mask_token_id": head.shape.mask_id,
                "embedding": head.mask_embedding.detach().cpu().clone()}, out / MASK_FILE)
    target_layers = tuple(k - 1 for k in head.shape.feature_layers)
    config = head.config.to_dict()
    config.update(architectures=[ARCHITECTURE], block_size=block_size,
                  dflash_config={"target_layer_ids": list(target_layers), "mask_token_id": head.shape.mask_id})
    config.pop("transformers_version", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return DflashExport(out, head.shape.drafted(block_size), target_layers)
