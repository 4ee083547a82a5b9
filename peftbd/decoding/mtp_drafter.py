"""FastMTP drafting: the MTP head applied recursively from the verifier's last hidden state.

KV choice: the head keeps its own one-layer KV cache per request (`state.drafter_state`). Its
entry at position j comes from (verifier hidden state at j-1, committed token x_j), exactly the
teacher-forced input of training step 1. Each round first appends the entries of the tokens the
last verify committed (the verifier's hidden states of those positions are in `state.hidden`);
the last of them is step 1, whose logits give draft token 1. Steps 2..num_steps feed the head
its own output hidden state and previous draft token; their entries are cropped afterwards, so the
head cache only ever holds committed positions (no recomputation over a window).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from peftbd.decoding.state import DecodeState
from peftbd.models.mtp_head import MTPHead


class MTPDrafter:
    """The FastMTP drafter: `num_steps` recursive MTP steps per round (paper: 3, verify width 4)."""

    name = "fastmtp"
    kv_layers = None  # reads `state.hidden`: the verifier's final hidden states
    feature_layers = ()

    def __init__(self, head: MTPHead, verifier: PreTrainedModel, num_steps: int = 3) -> None:
        if num_steps < 1:
            raise ValueError(f"num_steps={num_steps}; mtp.num_steps must be >= 1 (paper: 3)")
        head.bind(verifier)  # share this verifier's embeddings, final norm and LM head
        self.head = head.eval()
        self.num_steps = num_steps

    def start(self, state: DecodeState) -> None:
        state.drafter_state = DynamicCache()

    @torch.inference_mode()
    def propose(self, state: DecodeState, max_tokens: int) -> torch.Tensor:
        cache: DynamicCache = state.drafter_state
        n, length = state.hidden.shape[1], len(state.tokens)
        if length - 1 - cache.get_seq_length() != n:
            raise RuntimeError(
                f"MTP head cache holds {cache.get_seq_length()} positions but {length - 1} are "
                f"committed and state.hidden covers {n}: call propose exactly once per verify"
            )
        new = torch.tensor([state.tokens[-n:]], device=state.device)
        positions = torch.arange(length - n, length, device=state.device).unsqueeze(0)
        with state.forwards.timed("draft"):
            out = self.head(state.hidden, new, positions, cache=cache, logits_to_keep=1)
        steps = min(self.num_steps, max_tokens)
        if steps <= 0:
            return torch.empty(1, 0, dtype=torch.long, device=state.device)
        token, hidden = out.logits[:, -1:].argmax(-1), out.hidden[:, -1:]
        drafts = [token]
        for s in range(1, steps):
            pos = torch.tensor([[length - 1 + s]], device=state.device)
            with state.forwards.timed("draft"):
                out = self.head(hidden, token, pos, cache=cache)
            token, hidden = out.logits.argmax(-1), out.hidden
            drafts.append(token)
        cache.crop(-(steps - 1))
        return torch.cat(drafts, dim=1)
