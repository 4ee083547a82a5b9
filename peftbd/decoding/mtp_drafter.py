"""FastMTP drafting: the MTP head applied recursively from the verifier's last hidden state.

KV choice: the head keeps its own one-layer KV cache per request (`state.drafter_state`). Its
entry at position j comes from (verifier hidden state at j-1, committed token x_j), exactly the
teacher-forced input of training step 1. Each round first appends the entries of the tokens the
last verify committed (the verifier's hidden states of those positions are in `state.hidden`);
the last of them is step 1, whose logits give draft token 1. Steps 2..num_steps feed the head
its own output hidden state and previous draft token; their entries are dropped afterwards, so the
head cache only ever holds committed positions (no recomputation over a window). A batch of
requests runs each step as one forward, the rows' head caches packed (`peftbd.decoding.ragged`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from peftbd.decoding.cache_adapter import CacheAdapter
from peftbd.decoding.ragged import RowCache, left_aligned, pack, padded_ids
from peftbd.decoding.state import DecodeState, present, timed
from peftbd.models.mtp_head import MTPHead


class MTPDrafter:
    """The FastMTP drafter: `num_steps` recursive MTP steps per round (paper: 3, verify width 4)."""

    name = "FastMTP drafter"
    reads_kv_layers: int | None = 0  # its own head cache, never the verifier's KV
    reads_hidden = True  # the verifier's final hidden states
    feature_layers: tuple[int, ...] = ()

    def __init__(self, head: MTPHead, verifier: PreTrainedModel, num_steps: int = 3) -> None:
        if num_steps < 1:
            raise ValueError(f"num_steps={num_steps}; fastmtp.num_steps must be >= 1 (paper: 3)")
        head.bind(verifier)  # share this verifier's embeddings, final norm and LM head
        self.head = head.eval()
        self.num_steps = num_steps

    def start(self, state: DecodeState) -> None:
        state.drafter_state = RowCache.empty(state.device)

    @torch.inference_mode()
    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        caches = [present(s.drafter_state, "the MTP head's cache") for s in states]
        hiddens = [present(s.hidden, "state.hidden")[0] for s in states]
        for state, cache, h in zip(states, caches, hiddens):
            n, length = h.shape[0], len(state.tokens)
            if length - 1 - cache.get_seq_length() != n:
                raise RuntimeError(
                    f"MTP head cache holds {cache.get_seq_length()} positions but {length - 1} "
                    f"are committed and state.hidden covers {n}: call propose exactly once per verify"
                )
        device = states[0].device
        new = [h.shape[0] for h in hiddens]
        kv = pack(caches)
        hidden, valid = left_aligned(hiddens)
        tokens, _ = padded_ids([s.tokens[-n:] for s, n in zip(states, new)])
        positions, _ = padded_ids([range(len(s.tokens) - n, len(s.tokens)) for s, n in zip(states, new)])
        kv.open_chunk(None if valid.all() else valid, hidden.shape[1])
        mask = kv.chunk_mask(None, hidden.dtype)
        last = torch.tensor(new, device=device) - 1
        with timed(states, "draft"):
            out = self.head.step(hidden, tokens.to(device), positions.to(device), mask,
                                 CacheAdapter(kv))
            out = out[torch.arange(len(states), device=device), last].unsqueeze(1)  # step 1's
            logits = self.head.logits(out)
        steps = [min(self.num_steps, m) for m in max_tokens]
        token, hidden = logits.argmax(-1), out
        drafts = [token]
        for s in range(1, max(steps)):
            pos = torch.tensor([[len(state.tokens) - 1 + s] for state in states], device=device)
            kv.open_chunk(None, 1)
            mask = kv.chunk_mask(None, hidden.dtype)
            with timed(states, "draft"):
                out = self.head(hidden, token, pos, attention_mask=mask, cache=CacheAdapter(kv))
            token, hidden = out.logits.argmax(-1), out.hidden
            drafts.append(token)
        kv.commit(new)  # the committed positions only: the later steps' entries are dropped
        block = torch.cat(drafts, dim=1)
        return [block[i : i + 1, : max(k, 0)] for i, k in enumerate(steps)]
