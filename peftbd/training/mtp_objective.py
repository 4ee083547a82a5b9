"""The FastMTP objective: the MTP head learns from the frozen verifier's hidden states.

Teacher forcing over whole sequences y_0..y_{L-1} (prompt + continuation, right-padded). Let
h_i be the verifier's final hidden state at position i (it predicts y_{i+1}). Step 1 maps
(h_i, y_{i+1}) to g^1_i, which predicts y_{i+2}; step k > 1 maps (g^{k-1}_i, y_{i+k}) to g^k_i,
which predicts y_{i+k+1}: each step uses the previous step's hidden output and the embedding of
the true token at that step, and runs causally over the whole sequence at the positions of the
tokens it embeds (i + k).

Loss: per step k, the mean cross-entropy over the positions whose target y_{i+k+1} is a
continuation token (P <= i+k+1 < n for prompt length P and length n); the total is
sum_k w_k * CE_k with w = `cfg.fastmtp.loss_weights` ([0.51, 0.31, 0.18]).

A draft round after the verifier commits y_{i+1} proposes y_{i+2}..y_{i+K+1}: steps 1..K at
index i. Under teacher forcing the inputs equal the drafting inputs as long as every earlier
step was right, so the leading correct steps at index i are the tokens greedy verification
would accept from that round (`prefix_correct`), and eval counts them that way over every
index. `mtp_drafts` drafts the engine's rounds themselves (`peftbd.training.rounds`): step 1 as
above over the whole sequence, once (the engine's committed head cache), and steps 2..K per round
from their own output and draft token against it, as `MTPDrafter` runs them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from peftbd.models.mtp_head import MTPHead
from peftbd.training.chunked_loss import chunked_scores
from peftbd.training.examples import SequenceBatch
from peftbd.training.rounds import Drafts


@torch.no_grad()
def verifier_hidden_states(verifier: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    """Float (B, L, d): the verifier's final (post-norm) hidden states; right padding is harmless
    under causal attention."""
    return verifier.model(input_ids=ids).last_hidden_state


def mtp_stats(
    head: MTPHead, verifier: PreTrainedModel, batch: SequenceBatch, loss_weights: Sequence[float],
    chunk_rows: int = 0,
) -> dict[str, torch.Tensor]:
    """Sums over the batch: per step `ce_sum`, `targets`, `correct` (K,), plus `prefix_correct`
    and `round_targets` of the draft rounds, and `loss` (keeps its graph; see module doc). Each
    step's logits are computed over its target positions only, `chunk_rows` at a time
    (`peftbd.training.chunked_loss`; 0 = all at once)."""
    ids = batch.ids
    width = ids.shape[1]
    index = torch.arange(width, device=ids.device)
    hidden = verifier_hidden_states(verifier, ids)
    ce_sums, counts, hits, valids = [], [], [], []
    loss = ids.new_zeros((), dtype=torch.float32)
    for k, weight in enumerate(loss_weights, start=1):
        hidden = head.step(
            hidden[:, : width - k], ids[:, k:],
            position_ids=index[k:].unsqueeze(0).expand(ids.shape[0], -1),
        )
        target_pos = index[: width - k - 1] + k + 1
        valid = (target_pos >= batch.prompt_lens[:, None]) & (target_pos < batch.lengths[:, None])
        targets = ids[:, k + 1 :]
        scores = chunked_scores(hidden[:, : width - k - 1][valid], targets[valid], head.logits,
                                chunk_rows=chunk_rows)
        ce = scores.weighted_ce
        count = valid.sum()
        loss = loss + weight * ce / count.clamp_min(1)
        hit = torch.zeros_like(valid)
        hit[valid] = scores.hits
        ce_sums.append(ce.detach())
        counts.append(count)
        pad = (0, width - hit.shape[1])  # align every step on index i (width columns)
        hits.append(F.pad(hit, pad))
        valids.append(F.pad(valid, pad))
    hit, valid = torch.stack(hits, 1), torch.stack(valids, 1)  # (B, K, width)
    leading = torch.cumprod((hit | ~valid).long(), dim=1).bool() & valid
    rounds = valid[:, 0]  # the round's first target is a continuation token
    return {
        "loss": loss,
        "ce_sum": torch.stack(ce_sums),
        "targets": torch.stack(counts),
        "correct": hit.sum(dim=(0, 2)),
        "prefix_correct": (leading.sum(1) * rounds).sum(),
        "round_targets": (valid.sum(1) * rounds).sum(),
        "rounds": rounds.sum(),
    }


@torch.no_grad()
def mtp_drafts(head: MTPHead, verifier: PreTrainedModel, batch: SequenceBatch,
               num_steps: int) -> Drafts:
    """FastMTP's drafts of `batch`'s replayed rounds (`peftbd.training.rounds`; K = `num_steps`
    tokens each). The head's step-1 entry of position j comes from (h_{j-1}, y_j), as the
    engine's committed head cache holds it: computed once over every position. A round at c
    (y_0..y_{c-1} committed) drafts its first token from step 1 at position c-1, then step s
    from the previous step's output and draft token at position c-1+s, seeing the step-1 entries
    of positions 1..c-1 and the round's own; the round's entries are dropped afterwards."""
    ids = batch.ids
    rows, width = ids.shape
    device = ids.device
    cache = DynamicCache(config=head.config)
    positions = torch.arange(1, width, device=device).expand(rows, -1)
    first = head.step(verifier_hidden_states(verifier, ids)[:, :-1], ids[:, 1:], positions,
                      cache=cache)  # index i: position i + 1
    committed = width - 1  # cache slots: slot i holds position i + 1
    row = torch.arange(rows, device=device)

    def drafts(starts: list[list[int]]) -> torch.Tensor:
        c = torch.tensor([s[0] if s else 2 for s in starts], device=device)  # finished: a dummy
        out = first[row, c - 2]
        token = head.logits(out).float().argmax(-1)
        drafted = [token]
        for s in range(1, num_steps):
            slot = torch.arange(committed + s, device=device)
            seen = (slot.unsqueeze(0) < (c - 1).unsqueeze(1)) | (slot.unsqueeze(0) >= committed)
            mask = torch.zeros(seen.shape, dtype=out.dtype, device=device)
            mask.masked_fill_(~seen, torch.finfo(out.dtype).min)
            out = head.step(out[:, None], token[:, None], (c - 1 + s)[:, None],
                            attention_mask=mask[:, None, None], cache=cache)[:, 0]
            token = head.logits(out).float().argmax(-1)
            drafted.append(token)
        if num_steps > 1:
            cache.crop(1 - num_steps)  # the round's own entries
        return torch.stack(drafted, 1).cpu()

    return drafts
