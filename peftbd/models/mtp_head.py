"""The FastMTP head: one multi-token-prediction module on top of the frozen verifier.

One step maps (hidden state at position i, embedding of token x_{i+1}) to the hidden state that
predicts x_{i+2}:

    g = Qwen3DecoderLayer( W [RMSNorm_h(h_i) ; RMSNorm_e(E x_{i+1})] ),   logits = LMHead(Norm(g))

W is a Linear 2d -> d without bias. E (embeddings), Norm (the verifier's final norm) and LMHead
are the verifier's, shared and frozen: they are *not* parameters of the head, so `parameters()`,
`state_dict()` and `save_pretrained` hold only the head's own weights. `h` is the verifier's
final hidden state (after its final norm, i.e. the input of its LM head). The head is applied
recursively: step 1 takes the verifier's hidden state, step k > 1 takes step k-1's `g`.

The same `forward` serves training (teacher forcing: whole sequences of hidden states and next
tokens, causal attention) and decoding (a few positions on top of the head's own KV cache).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Cache, PreTrainedModel
from transformers.masking_utils import create_causal_mask
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3DecoderLayer,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
)

from peftbd.models.flat import flat

WEIGHTS_FILE = "mtp_head.safetensors"
CONFIG_FILE = "mtp_head.json"
FORMAT = "peftbd-mtp-head-v1"
HEAD_SUBDIR = "mtp_head"
"""Where a FastMTP training run (jobs.train --method fastmtp) puts the head under its output dir."""


@dataclass
class MTPOutput:
    """One MTP step: `hidden` (pre-norm, feeds the next step) and `logits` over the vocabulary."""

    hidden: torch.Tensor
    logits: torch.Tensor


class MTPHead(nn.Module):
    """FastMTP's MTP module bound to a verifier (a `*ForCausalLM` with `.model.embed_tokens`,
    `.model.norm`, `.lm_head`); created on the verifier's device and dtype, untrained."""

    _shared: tuple[nn.Module, nn.Module, nn.Module]
    """The verifier's (embeddings, final norm, LM head), set by `bind` outside the module tree."""

    def __init__(self, verifier: PreTrainedModel) -> None:
        super().__init__()
        config = verifier.config
        d = config.hidden_size
        self.config = config
        self.hidden_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)
        self.embed_norm = Qwen3RMSNorm(d, eps=config.rms_norm_eps)
        self.proj = nn.Linear(2 * d, d, bias=False)
        self.layer = Qwen3DecoderLayer(config, layer_idx=0)
        self.rotary_emb = Qwen3RotaryEmbedding(config=config)
        self.bind(verifier)
        ref = next(verifier.parameters())
        self.to(device=ref.device, dtype=ref.dtype)

    def bind(self, verifier: PreTrainedModel) -> None:
        """Use `verifier`'s embeddings, final norm and LM head (kept out of this module's params)."""
        base = verifier.get_base_model() if hasattr(verifier, "get_base_model") else verifier
        object.__setattr__(self, "_shared", (base.get_input_embeddings(), base.model.norm, base.lm_head))

    def forward(
        self,
        hidden_states: torch.Tensor,
        next_token_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        logits_to_keep: int = 0,
    ) -> MTPOutput:
        """One MTP step over a sequence.

        hidden_states (B, L, d): verifier hidden states (step 1) or the previous step's `hidden`;
        next_token_ids (B, L): the token after each hidden state's position; position_ids (B, L):
        positions of those next tokens; attention_mask: a 2D padding mask (B, past + L) or a
        prepared 4D mask, None = causal; cache: the head's own cache (one layer), updated in place;
        logits_to_keep: logits of the last this many positions only (0: all; `hidden` is always
        every position's).
        """
        g = self.step(hidden_states, next_token_ids, position_ids, attention_mask, cache)
        return MTPOutput(hidden=g, logits=self.logits(g[:, -logits_to_keep:] if logits_to_keep else g))

    def step(
        self,
        hidden_states: torch.Tensor,
        next_token_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
    ) -> torch.Tensor:
        """`forward`'s hidden output alone (no logits): training scores it in chunks of positions
        (`peftbd.training.chunked_loss`) instead of over the whole vocabulary at once."""
        embed, _, _ = self._shared
        x = torch.cat(
            [self.hidden_norm(hidden_states), self.embed_norm(embed(next_token_ids))], dim=-1
        )
        x = self.proj(x)
        mask = create_causal_mask(
            config=self.config, inputs_embeds=x, attention_mask=attention_mask, cache=cache,
            position_ids=position_ids,
        )
        return self.layer(
            x,
            attention_mask=mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=cache is not None,
            position_embeddings=self.rotary_emb(x, position_ids),
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The verifier's final norm and LM head over step outputs `hidden` (..., d)."""
        _, final_norm, lm_head = self._shared
        return flat(lm_head, final_norm(hidden))

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Write the head's own weights (safetensors) and the verifier shape it needs (json)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(out_dir / WEIGHTS_FILE))
        meta = {"format": FORMAT, **_shape(self.config)}
        (out_dir / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
        return out_dir

    @classmethod
    def from_pretrained(cls, peftbd_head_dir: str | Path, verifier: PreTrainedModel) -> MTPHead:
        """Load a head saved by `save_pretrained` (or the output dir of a FastMTP training run,
        which holds it in `mtp_head/`) onto `verifier` (shapes must match)."""
        peftbd_head_dir = Path(peftbd_head_dir)
        if not (peftbd_head_dir / CONFIG_FILE).is_file():
            peftbd_head_dir = peftbd_head_dir / HEAD_SUBDIR
        meta_path = peftbd_head_dir / CONFIG_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"peftbd_head_dir={str(peftbd_head_dir.parent)!r} holds no {CONFIG_FILE}, nor does its "
                f"{HEAD_SUBDIR}/; pass the output dir of jobs.train --method fastmtp or a directory written by "
                "MTPHead.save_pretrained"
            )
        meta = json.loads(meta_path.read_text())
        expected = _shape(verifier.config)
        saved = {k: meta.get(k) for k in expected}
        if saved != expected:
            raise ValueError(
                f"MTP head in {str(peftbd_head_dir)!r} was trained for verifier shape {saved}, but the "
                f"verifier has {expected}; load the head with the verifier it was trained on"
            )
        head = cls(verifier)
        ref = next(verifier.parameters())
        state = load_file(str(peftbd_head_dir / WEIGHTS_FILE), device=str(ref.device))
        head.load_state_dict(state)
        return head


def _shape(config) -> dict[str, int]:
    keys = ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "intermediate_size")
    return {k: int(getattr(config, k)) for k in keys}
