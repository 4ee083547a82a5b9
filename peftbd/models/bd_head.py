"""The block-diffusion head (DFlash-style): a few decoder layers of its own draft a whole block
in one forward, conditioned on the verifier's hidden states, instead of the adapter-on backbone.

Context. For every committed position i the verifier's hidden states at `feature_layers`
(indices into transformers' `hidden_states`: 0 = the embeddings, k = the output of decoder
layer k, L = the final, post-norm one) are concatenated and projected,
c_i = RMSNorm(W_c [h^{l_1}_i; ...; h^{l_m}_i]). Each head layer turns c_i into a key and a value
with its own k_proj / k_norm / v_proj at position i (rotary included): the context KV, injected
into that layer's cache once per committed position (DFlash's KV injection; no attention or MLP
runs over the context).

Block. The chunk `[b, m_1..m_K]` (b = the last committed token at position t, embedded by the
verifier's table and, with `anchor_fusion`, fused with c_{t-1}, the context of the position that
predicted it, W_f [RMSNorm(E b); c_{t-1}], as EAGLE and MTP fuse a token with its predecessor's
hidden state, where DFlash embeds it plainly; m = the head's learned mask embedding) runs
through the head's layers at positions t..t+K over [context KV | chunk] with PEFT-BD's draft
pattern (`peftbd.models.peft_bd`: unanchored, or with `anchored` DFlash's, where b sees the masks
too); the head's final norm and the verifier's LM head
give the logits, chunk position j >= 1 predicting x_{t+j} (no shift): the PEFT-BD contract, so
training cuts blocks with the same code. The chunk's KV is cropped off afterwards. K = D
(`block_masks` block) or, DFlash's block of D positions in all, D - 1 (block_minus_one):
`HeadShape.drafted`.

Shared, not copied: the verifier's embeddings and LM head are bound, not parameters, so
`parameters()`, `state_dict()` and `save_pretrained` hold only W_c, the layers, their norms, the
mask embedding, and W_f and its norm with `anchor_fusion`. A draft vocabulary (FR-Spec) restricts
the draft LM head to N token ids (`draft_vocabulary`): their (N, d) rows are gathered once per
drafter, and the argmax maps back to token ids.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Cache, PreTrainedModel
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3Attention,
    Qwen3DecoderLayer,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    rotate_half,
)

from peftbd.config import HeadConfig
from peftbd.models.flat import flat

WEIGHTS_FILE = "bd_head.safetensors"
CONFIG_FILE = "bd_head.json"
FORMAT = "peftbd-bd-head-v1"
HEAD_SUBDIR = "bd_head"
"""Where a head training run (jobs.train --method peftbd_head) puts the head under its output dir."""
SHAPE_KEYS = ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "num_hidden_layers")


@dataclass(frozen=True)
class HeadShape:
    """What a saved head needs of its verifier and how it is built (written beside its weights)."""

    layers: int
    intermediate_size: int
    feature_layers: tuple[int, ...]
    mask_id: int
    block_masks: str = "block"  # HeadConfig.block_masks
    anchor_fusion: bool = True  # HeadConfig.anchor_fusion
    anchored: bool = False  # HeadConfig.anchored

    @classmethod
    def of(cls, cfg: HeadConfig, verifier_config, mask_id: int) -> HeadShape:
        """The shape `cfg` asks for on this verifier (0 = the verifier's MLP width)."""
        width = cfg.intermediate_size or int(verifier_config.intermediate_size)
        return cls(cfg.layers, width, tuple(feature_layers(cfg, verifier_config)), mask_id,
                   cfg.block_masks, cfg.anchor_fusion, cfg.anchored)

    @classmethod
    def saved(cls, meta: dict) -> HeadShape:
        """The shape recorded in a saved head's json (`saved_head`; a head saved before
        `block_masks`, `anchor_fusion` or `anchored` existed drafts whole blocks, its anchor fused
        and unanchored)."""
        return cls(int(meta["layers"]), int(meta["intermediate_size"]),
                   tuple(meta["feature_layers"]), int(meta["mask_id"]),
                   meta.get("block_masks", "block"), bool(meta.get("anchor_fusion", True)),
                   bool(meta.get("anchored", False)))

    def drafted(self, block_size: int) -> int:
        """Tokens this head drafts a round at its section's `block_size` (`drafted`)."""
        return drafted(self.block_masks, block_size)


def drafted(block_masks: str, block_size: int) -> int:
    """Tokens a round drafts: D = `block_size` for `block` ([b, D masks]), D - 1 for
    `block_minus_one` (DFlash's block of D positions, b's included)."""
    count = block_size - (block_masks == "block_minus_one")
    if count < 1:
        raise ValueError(f"block_size={block_size} leaves a {block_masks} head no token to "
                         "draft; set its section's block_size >= 2")
    return count


def saved_head(peftbd_head_dir: str | Path) -> tuple[Path, dict]:
    """(the directory holding a saved head's files, its parsed json) of a directory written by
    `save_pretrained` or of a head training run's output dir (which holds it in `bd_head/`)."""
    peftbd_head_dir = Path(peftbd_head_dir)
    if not (peftbd_head_dir / CONFIG_FILE).is_file():
        peftbd_head_dir = peftbd_head_dir / HEAD_SUBDIR
    if not (peftbd_head_dir / CONFIG_FILE).is_file():
        raise FileNotFoundError(
            f"peftbd_head_dir={str(peftbd_head_dir.parent)!r} holds no {CONFIG_FILE}, nor does its "
            f"{HEAD_SUBDIR}/; pass the output dir of jobs.train --method peftbd_head or a directory written "
            "by BDHead.save_pretrained"
        )
    return peftbd_head_dir, json.loads((peftbd_head_dir / CONFIG_FILE).read_text())


def saved_shape(peftbd_head_dir: str | Path, verifier_config) -> tuple[Path, HeadShape]:
    """(the directory holding a saved head's files, `saved_head`, its shape): read from its json
    alone (no module, no weights) and checked against the config of the verifier it will run on."""
    peftbd_head_dir, meta = saved_head(peftbd_head_dir)
    expected = _verifier_shape(verifier_config)
    if meta.get("verifier") != expected:
        raise ValueError(
            f"the head in {str(peftbd_head_dir)!r} was trained for verifier shape {meta.get('verifier')}, "
            f"but the verifier has {expected}; load it with the verifier it was trained on"
        )
    return peftbd_head_dir, HeadShape.saved(meta)


@dataclass(frozen=True)
class DraftVocabulary:
    """A draft LM head over N token ids (FR-Spec): the ids, their (N, d) LM-head rows, and
    where the mask token is among them."""

    ids: torch.Tensor
    rows: torch.Tensor
    is_mask: torch.Tensor


def dflash_target_layers(depth: int, count: int) -> list[int]:
    """DFlash's target layers (z-lab/dflash `build_target_layer_ids`; 0-based decoder layers) for
    a head of `count` layers on a `depth`-layer verifier: the middle one for a single layer, else
    `count` evenly spaced from layer 1 to layer depth - 3 (28 layers, 5: [1, 7, 13, 19, 25]).
    Under 4 layers, where DFlash has no rule, `count` evenly spaced over all but the last (a 2-layer
    verifier: [0]), distinct: DFlash never reads the last layer, whose output transformers gives
    after the final norm and vLLM before it."""
    if depth < 4:
        last = max(depth - 2, 0)
        return sorted({round(i * last / max(count - 1, 1)) for i in range(count)})
    if count == 1:
        return [depth // 2]
    return sorted({round(1 + i * (depth - 4) / (count - 1)) for i in range(count)})


def feature_layers(cfg: HeadConfig, verifier_config) -> list[int]:
    """`cfg.feature_layers`, checked against the verifier's depth; [] = `cfg.feature_rule`'s:
    `three` spreads three layers evenly from the first to the last (for a 2-layer verifier:
    [1, 2]); `per_layer` reads the output of each of DFlash's target layers (hidden_states index
    = `dflash_target_layers` + 1, as DFlash: Qwen3-0.6B, 5 layers: [2, 8, 14, 20, 26]; a 2-layer
    verifier: [1])."""
    depth = int(verifier_config.num_hidden_layers)
    if cfg.feature_rule == "per_layer":
        rule = [k + 1 for k in dflash_target_layers(depth, cfg.layers)]
    else:
        rule = sorted({round(1 + i * (depth - 1) / 2) for i in range(3)})
    layers = list(cfg.feature_layers) or rule
    bad = [k for k in layers if not 0 <= k <= depth]
    if bad:
        raise ValueError(f"peftbd_head.feature_layers={layers}: {bad} outside 0..{depth} (the verifier has "
                         f"{depth} layers; 0 = embeddings, {depth} = the final hidden state)")
    return layers


def _unwrapped(module: nn.Module) -> nn.Module:
    """The base table under peft's trainable-token wrapper (a PEFT-BD adapter on the same
    verifier): the verifier's own rows, with no per-forward copy of the table."""
    layer = getattr(module, "token_adapter", None)
    return module if layer is None else layer.base_layer


def _verifier_shape(config) -> dict[str, int]:
    return {k: int(getattr(config, k)) for k in SHAPE_KEYS}


class BDHead(nn.Module):
    """The block-diffusion head bound to a verifier (a `*ForCausalLM` with `.model.embed_tokens`
    and `.lm_head`); created on the verifier's device and dtype, untrained."""

    _shared: tuple[nn.Module, nn.Module]
    """The verifier's (input embeddings, LM head), set by `bind` outside the module tree."""

    def __init__(self, verifier: PreTrainedModel, shape: HeadShape) -> None:
        super().__init__()
        vcfg = verifier.config
        d = int(vcfg.hidden_size)
        config = copy.deepcopy(vcfg)
        config.num_hidden_layers = shape.layers
        config.intermediate_size = shape.intermediate_size
        config.layer_types = ["full_attention"] * shape.layers
        self.config = config
        self.shape = shape
        self.verifier_shape = _verifier_shape(vcfg)
        self.project = nn.Linear(len(shape.feature_layers) * d, d, bias=False)
        self.context_norm = Qwen3RMSNorm(d, eps=vcfg.rms_norm_eps)
        if shape.anchor_fusion:
            self.anchor_norm = Qwen3RMSNorm(d, eps=vcfg.rms_norm_eps)
            self.fuse = nn.Linear(2 * d, d, bias=False)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config, i) for i in range(shape.layers))
        self.norm = Qwen3RMSNorm(d, eps=vcfg.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config=config)
        self.bind(verifier)
        embed = verifier.get_input_embeddings().weight
        self.mask_embedding = nn.Parameter(embed[shape.mask_id].detach().clone())
        self.to(device=embed.device, dtype=embed.dtype)

    def bind(self, verifier: PreTrainedModel) -> None:
        """Use `verifier`'s embeddings and LM head (kept out of this module's parameters)."""
        base = verifier.get_base_model() if hasattr(verifier, "get_base_model") else verifier
        object.__setattr__(self, "_shared", (_unwrapped(base.get_input_embeddings()),
                                             _unwrapped(base.get_output_embeddings())))

    def draft_vocabulary(self, vocab_ids: torch.Tensor) -> DraftVocabulary:
        """The draft LM head over `vocab_ids` (N,) only: their rows of the bound LM head."""
        weight = self._shared[1].weight
        assert isinstance(weight, torch.Tensor)  # the LM head's (vocab, d) Parameter
        ids = vocab_ids.to(device=weight.device, dtype=torch.long)
        return DraftVocabulary(ids, weight[ids].detach(), ids == self.shape.mask_id)

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """c (B, n, d): the projected context of verifier `features` (B, n, m*d)."""
        return self.context_norm(self.project(features.to(self.mask_embedding.dtype)))

    def add_context(self, context: torch.Tensor, positions: torch.Tensor, cache: Cache) -> None:
        """Append the KV of `context` (B, n, d; `context`) at `positions` (B, n) to every head
        layer's entry of `cache` (see module doc)."""
        cos, sin = self.rotary_emb(context, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        for layer in self.layers:
            attn = cast(Qwen3Attention, layer.self_attn)
            shape = (*context.shape[:-1], -1, attn.head_dim)
            k = attn.k_norm(attn.k_proj(context).view(shape)).transpose(1, 2)
            v = attn.v_proj(context).view(shape).transpose(1, 2)
            cache.update(k * cos + rotate_half(k) * sin, v, attn.layer_idx)

    def embed(self, chunk_ids: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """Input embeddings of K chunks `chunk_ids` (B, K*(D+1)): the verifier's rows, the mask
        embedding at masks, and, with `anchor_fusion`, each chunk's first token b fused with its
        predecessor's context `anchor` (B, K, d): W_f [RMSNorm(E b); c_{t-1}] (see module doc)."""
        x = self._shared[0](chunk_ids)
        x = torch.where((chunk_ids == self.shape.mask_id).unsqueeze(-1),
                        self.mask_embedding.to(x.dtype), x)
        if not self.shape.anchor_fusion:
            return x
        b, k = anchor.shape[:2]
        x = x.view(b, k, -1, x.shape[-1])
        first = self.fuse(torch.cat([self.anchor_norm(x[:, :, 0]), anchor.to(x.dtype)], -1))
        return torch.cat([first.unsqueeze(2), x[:, :, 1:]], 2).flatten(1, 2)

    def block_hidden(self, chunk_ids: torch.Tensor, positions: torch.Tensor,
                     attention_mask: torch.Tensor, cache: Cache, anchor: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states (B, Q, d) of chunks `chunk_ids` (B, Q) at `positions`
        over [cache | chunks] with the additive 4D `attention_mask` (`anchor`: see `embed`);
        appends the chunks' KV to `cache` (the caller crops it)."""
        x = self.embed(chunk_ids, anchor)
        rotary = self.rotary_emb(x, positions)
        for layer in self.layers:
            x = layer(x, attention_mask=attention_mask, position_ids=positions, cache=cache,
                      use_cache=True, position_embeddings=rotary)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits of `hidden` (..., d) through the verifier's LM head (training)."""
        return flat(self._shared[1], hidden)

    def draft_tokens(self, hidden: torch.Tensor, vocab: DraftVocabulary | None = None) -> torch.Tensor:
        """Long (...,): the greedy draft tokens of `hidden` over the whole vocabulary, or over
        `vocab` (`draft_vocabulary`); the mask token is never proposed."""
        if vocab is None:
            logits = self.logits(hidden).float()
            logits[..., self.shape.mask_id] = -torch.inf
            return logits.argmax(-1)
        logits = flat(lambda h: nn.functional.linear(h, vocab.rows), hidden).float()
        logits[..., vocab.is_mask] = -torch.inf
        return vocab.ids[logits.argmax(-1)]

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Write the head's own weights (safetensors) and its shape and the verifier's (json)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(out_dir / WEIGHTS_FILE))
        meta = {"format": FORMAT, "layers": self.shape.layers,
                "intermediate_size": self.shape.intermediate_size,
                "feature_layers": list(self.shape.feature_layers), "mask_id": self.shape.mask_id,
                "block_masks": self.shape.block_masks, "anchor_fusion": self.shape.anchor_fusion,
                "anchored": self.shape.anchored,
                "verifier": self.verifier_shape}
        (out_dir / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
        return out_dir

    @classmethod
    def from_pretrained(cls, peftbd_head_dir: str | Path, verifier: PreTrainedModel) -> BDHead:
        """Load a head saved by `save_pretrained` (or the output dir of a head training run, which
        holds it in `bd_head/`) onto `verifier` (its shape must match)."""
        peftbd_head_dir, shape = saved_shape(peftbd_head_dir, verifier.config)
        head = cls(verifier, shape)
        state = load_file(str(peftbd_head_dir / WEIGHTS_FILE), device=str(head.mask_embedding.device))
        head.load_state_dict(state)
        return head
