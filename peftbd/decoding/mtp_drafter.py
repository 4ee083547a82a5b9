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
from peftbd.decoding.fast_path import Chunk
from peftbd.decoding.ragged import RaggedKV, RowCache, pack
from peftbd.decoding.row_batch import left_aligned, padded_ids
from peftbd.decoding.state import DecodeState, drafter_cache, present, timed
from peftbd.models.mtp_head import MTPHead


def _first_step(mask: torch.Tensor | None, cache: CacheAdapter, head: MTPHead, hidden: torch.Tensor,
                tokens: torch.Tensor, positions: torch.Tensor, last: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 over the newly committed positions (a `peftbd.decoding.fast_path.Call`): the
    output hidden state (B, 1, d) and greedy token (B, 1) of each row's `last` one."""
    out = head.step(hidden, tokens, positions, mask, cache)
    out = out[torch.arange(out.shape[0], device=out.device), last].unsqueeze(1)
    return out, head.logits(out).argmax(-1)


def _next_step(mask: torch.Tensor | None, cache: CacheAdapter, head: MTPHead, hidden: torch.Tensor,
               token: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A later step from the previous one's hidden state and token (a `Call`)."""
    out = head(hidden, token, positions, attention_mask=mask, cache=cache)
    return out.hidden, out.logits.argmax(-1)


class MTPDrafter:
    """The FastMTP drafter: `num_steps` recursive MTP steps per round (paper: 3, verify width 4)."""

    name = "FastMTP drafter"
    reads_kv_layers: int | None = 0  # its own head cache, never the verifier's KV
    reads_hidden = True  # the verifier's final hidden states
    feature_layers: tuple[int, ...] = ()
    draft_on_path = True  # its forwards run through `state.path` (compiled on the fast path)

    def __init__(self, head: MTPHead, verifier: PreTrainedModel, num_steps: int = 3) -> None:
        if num_steps < 1:
            raise ValueError(f"num_steps={num_steps}; fastmtp.num_steps must be >= 1 (paper: 3)")
        head.bind(verifier)  # share this verifier's embeddings, final norm and LM head
        self.head = head.eval()
        self.pool = RaggedKV([], next(head.parameters()).device)  # the head's KV: a row per request
        self.num_steps = num_steps

    def start(self, state: DecodeState) -> None:
        state.drafter_state = RowCache.empty(self.pool)

    @torch.inference_mode()
    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        caches = [drafter_cache(s, "the MTP head's cache") for s in states]
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
        last = torch.tensor(new, device=device) - 1
        path, head = states[0].path, self.head
        first = Chunk(hidden.shape[1], 1, hidden.dtype, None if valid.all() else valid)
        with timed(states, "draft"):
            hidden, token = path.run(_first_step, head.config, kv, first, head, hidden,
                                     tokens.to(device), positions.to(device), last)
        steps = [min(self.num_steps, m) for m in max_tokens]
        drafts = [token]
        for s in range(1, max(steps)):
            pos = torch.tensor([[len(state.tokens) - 1 + s] for state in states], device=device)
            with timed(states, "draft"):
                hidden, token = path.run(_next_step, head.config, kv, Chunk(1, 1, hidden.dtype),
                                         head, hidden, token, pos)
            drafts.append(token)
        kv.commit(new)  # the committed positions only: the later steps' entries are dropped
        block = torch.cat(drafts, dim=1)
        return [block[i : i + 1, : max(k, 0)] for i, k in enumerate(steps)]
