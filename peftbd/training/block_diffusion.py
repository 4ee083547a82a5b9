"""The PEFT-BD block-diffusion objective, trained exactly as the engine drafts.

Cutting a sequence into blocks. A sequence y_0..y_{n-1} (0-based) has prompt length P and a
continuation y_P..y_{n-1}; block k starting at s covers y_s..y_{s+D-1}. `peftbd.block_offsets`:

- `random` (default): the starts are s = P+1+o, P+1+o+D, ... < n with o in [0, D) drawn per
  (seed, epoch, row id) (`block_offset`). The engine never drafts y_P (prefill commits it), its
  first round drafts from P+1 and every later one from wherever the previous round ended, so
  its rounds start at every position after P; over the epochs a row is cut at every offset.
- `aligned` (the paper's BD3LM-style cut, kept as the ablation): s = P, P+D, P+2D, ...

DFlash's anchors (`random_starts`, the head's `anchors` > 0) instead draw up to N distinct starts
uniformly from P+1..n-1 per (seed, epoch, row id): blocks overlap wherever they fall.

The last block is partial when it runs past the end (a continuation shorter than D is one
partial block): its positions past the end are always mask tokens and carry no loss, exactly
what a full-mask draft near the end of a text looks like.

The draft pattern (`peftbd.models.peft_bd`, shared with the engine). For a block at s the
drafter sees the clean context y_0..y_{s-2} as the verifier's adapter-OFF KV (no grad) and runs
the adapter ON over the chunk `[y_{s-1}, noised y_s..y_{s+D-1}]` at positions s-1..s+D-1, with
`draft_visibility` deciding who attends to whom. Chunk position j+1 predicts y_{s+j} (no shift).

Noise. Per block, t ~ U[mask_ratio_min, mask_ratio_max] and exactly max(1, round(t * v)) of the
block's v real positions are replaced by the mask token (uniformly without replacement). At
t = 1 the whole block is masked, which is what inference drafts. The noise of a row is a pure
function of (seed, epoch, row id), as are its block offsets, so a run is reproducible and a
resumed run sees the same blocks and noise.

Linear-prefix loss. Block position j (0-based) weighs gamma^j and the loss is the weighted mean
of the cross-entropy over the masked real positions of the micro-batch:

    L = sum_{masked (b, j)} gamma^j * CE(b, j) / sum_{masked (b, j)} gamma^j

It is linear in the per-token losses and discounts later positions because a drafted token only
counts if every earlier token of its block is accepted: with a per-token acceptance rate near
gamma, position j is used with probability ~gamma^j, so these weights make the loss track the
expected accepted prefix. DFlash's decay (`decay` g > 0) weighs position j exp(-j / g) instead.

One forward per micro-batch (BD3LM's clean || noised trick, exact). The adapter-off KV of every
whole clean sequence is computed once; all block chunks of a sequence are concatenated into one
query sequence whose 4D mask over [clean KV | chunks] gives chunk k the columns of context
y_0..y_{s_k-2} and its own chunk (with `draft_visibility`'s pattern), nothing else. A test shows
the logits equal the plain per-block draft forward.

An early-exit adapter (`peftbd.draft_layers = k`, `peftbd.models.early_exit`) runs both forwards
through its first k layers only, exactly as it drafts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from peft import PeftModel
from transformers import DynamicCache

from peftbd.config_sections import BlockOffsets
from peftbd.models.early_exit import adapter_depth, crop_first_layers, first_layers
from peftbd.models.peft_bd import (
    adapted_logits,
    adapter_on,
    draft_input_ids,
    draft_position_ids,
    draft_visibility,
    set_adapter_enabled,
)
from peftbd.training.chunked_loss import LogitsFn, chunked_scores
from peftbd.training.examples import SequenceBatch

IGNORE = -100


def prefix_weights(block_size: int, gamma: float, decay: float = 0.0) -> torch.Tensor:
    """Float (block_size,): block position j's loss weight, gamma^j, or DFlash's exp(-j / decay)
    when `decay` > 0 (its block position k = j + 1 weighs exp(-(k - 1) / decay))."""
    j = torch.arange(block_size, dtype=torch.float64)
    return torch.exp(-j / decay).float() if decay > 0 else gamma ** j.float()


def _row_hash(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def noise_generator(seed: int, epoch: int, row_id: str) -> torch.Generator:
    """The generator of one row's noise in one epoch (independent of batching and workers)."""
    return torch.Generator().manual_seed(_row_hash(f"{seed}:{epoch}:{row_id}") & (2**63 - 1))


def block_offset(seed: int, epoch: int, row_id: str, block_size: int) -> int:
    """o in [0, block_size): where one row's `random` blocks start in one epoch (see module doc)."""
    return _row_hash(f"offset:{seed}:{epoch}:{row_id}") % block_size


def block_starts(
    batch: SequenceBatch, block_size: int, offsets: BlockOffsets, seed: int, epoch: int,
    stride: int | None = None,
) -> list[list[int]]:
    """Each row's block starts s (the index of the block's first token, see module doc): one
    every `stride` positions (default `block_size`: blocks tile the row; smaller: they overlap,
    each still a whole draft), the random offset drawn in [0, stride)."""
    stride = stride or block_size
    rows = zip(batch.prompt_lens.tolist(), batch.lengths.tolist(), batch.row_ids, strict=True)
    starts = []
    for p, n, row_id in rows:
        first = p if offsets == "aligned" else p + 1 + block_offset(seed, epoch, row_id, stride)
        starts.append(list(range(first, n, stride)))
    return starts


def random_starts(batch: SequenceBatch, count: int, seed: int, epoch: int) -> list[list[int]]:
    """Each row's block starts as DFlash's anchors: min(`count`, n - P - 1) distinct starts drawn
    uniformly from P+1..n-1 (every start the engine drafts from), sorted; a pure function of
    (seed, epoch, row id), as `block_offset`."""
    rows = zip(batch.prompt_lens.tolist(), batch.lengths.tolist(), batch.row_ids, strict=True)
    starts = []
    for p, n, row_id in rows:
        gen = torch.Generator().manual_seed(_row_hash(f"anchors:{seed}:{epoch}:{row_id}") >> 1)
        picked = torch.randperm(max(n - p - 1, 0), generator=gen)[:count]
        starts.append(sorted((p + 1 + picked).tolist()))
    return starts


def sample_block_mask(
    valid: int, block_size: int, t_min: float, t_max: float, gen: torch.Generator
) -> torch.Tensor:
    """Bool (block_size,): True where the block position is a mask token.

    `valid` real positions; max(1, round(t * valid)) of them are masked for t ~ U[t_min, t_max];
    positions past `valid` (the end of a partial last block) are always masked.
    """
    t = t_min + (t_max - t_min) * torch.rand((), generator=gen).item()
    n_masked = max(1, round(t * valid))
    masked = torch.ones(block_size, dtype=torch.bool)
    masked[:valid] = False
    masked[torch.randperm(valid, generator=gen)[:n_masked]] = True
    return masked


@dataclass(frozen=True)
class DraftBatch:
    """Every block of every sequence of a micro-batch as one adapter-on query sequence per row.

    Row b's query sequence is `num_blocks` chunks of D + 1 (rows with fewer blocks are filled
    with dummy chunks that only see themselves and carry no loss).
    """

    clean_ids: torch.Tensor  # long (B, L): the clean sequences (their adapter-off KV)
    chunk_ids: torch.Tensor  # long (B, K*(D+1))
    chunk_positions: torch.Tensor  # long (B, K*(D+1))
    attention_mask: torch.Tensor  # float (B, 1, K*(D+1), L + K*(D+1)), additive
    labels: torch.Tensor  # long (B, K*(D+1)): target token at masked real positions, else -100
    weights: torch.Tensor  # float (B, K*(D+1)): gamma^j at labelled positions, else 0
    block_size: int
    num_blocks: int
    mask_id: int

    def to(self, device: torch.device) -> DraftBatch:
        move = {k: getattr(self, k).to(device) for k in (
            "clean_ids", "chunk_ids", "chunk_positions", "attention_mask", "labels", "weights")}
        return DraftBatch(**move, block_size=self.block_size, num_blocks=self.num_blocks,
                          mask_id=self.mask_id)

    def block_view(self, x: torch.Tensor) -> torch.Tensor:
        """(B, K*(D+1), ...) -> (B, K, D, ...): the D block positions of each chunk."""
        b = x.shape[0]
        return x.view(b, self.num_blocks, self.block_size + 1, *x.shape[2:])[:, :, 1:]


def build_draft_batch(
    batch: SequenceBatch,
    starts: list[list[int]],
    *,
    block_size: int,
    mask_id: int,
    pad_id: int,
    anchored: bool,
    gamma: float,
    t_range: tuple[float, float],
    seed: int,
    epoch: int,
    dtype: torch.dtype = torch.float32,
    decay: float = 0.0,
) -> DraftBatch:
    """Noise the blocks of `batch` that start at `starts` (per row, each in P..n-1) and lay the
    chunks out for one forward, weighing the loss with `prefix_weights(gamma, decay)` (see
    module doc)."""
    d, chunk = block_size, block_size + 1
    n_rows, width = batch.ids.shape
    num_blocks = max([1, *map(len, starts)])  # rows with fewer blocks get dummy chunks
    q = num_blocks * chunk
    chunk_ids = torch.full((n_rows, q), pad_id, dtype=torch.long)
    positions = torch.zeros((n_rows, q), dtype=torch.long)
    labels = torch.full((n_rows, q), IGNORE, dtype=torch.long)
    visible = torch.zeros((n_rows, q, width + q), dtype=torch.bool)
    visible[:, torch.arange(q), width + torch.arange(q)] = True  # dummy chunks see themselves
    for r, row_starts in enumerate(starts):
        seq, n = batch.ids[r], int(batch.lengths[r])
        gen = noise_generator(seed, epoch, batch.row_ids[r])
        for k, s in enumerate(row_starts):
            cache_len, rows = s - 1, slice(k * chunk, (k + 1) * chunk)
            valid = min(d, n - s)
            masked = sample_block_mask(valid, d, t_range[0], t_range[1], gen)
            ids = draft_input_ids(int(seq[s - 1]), mask_id, d)[0]
            target = torch.full((d,), IGNORE, dtype=torch.long)
            target[:valid] = seq[s : s + valid]
            ids[1:][~masked] = target[~masked]
            chunk_ids[r, rows] = ids
            positions[r, rows] = draft_position_ids(cache_len, d)[0]
            labels[r, rows][1:] = torch.where(masked, target, IGNORE)
            pattern = draft_visibility(cache_len, d, anchored)
            visible[r, rows, :cache_len] = pattern[:, :cache_len]
            visible[r, rows, width + k * chunk : width + (k + 1) * chunk] = pattern[:, cache_len:]
    weights = torch.zeros((n_rows, num_blocks, chunk))
    weights[:, :, 1:] = prefix_weights(d, gamma, decay)
    weights = weights.view(n_rows, q) * (labels != IGNORE)
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)
    return DraftBatch(
        clean_ids=batch.ids, chunk_ids=chunk_ids, chunk_positions=positions,
        attention_mask=mask.unsqueeze(1), labels=labels, weights=weights,
        block_size=d, num_blocks=num_blocks, mask_id=mask_id,
    )


def clean_cache(model: PeftModel, clean_ids: torch.Tensor) -> DynamicCache:
    """The adapter-off (verifier) KV of the clean sequences, through the drafter's layers."""
    backbone = model.get_base_model().model
    set_adapter_enabled(model, False)
    cache = DynamicCache(config=backbone.config)
    with torch.no_grad(), first_layers(backbone.config, adapter_depth(model)):  # early exit: k layers
        backbone(input_ids=clean_ids, cache=cache, use_cache=True)
    return cache


def chunk_hidden_states(
    model: PeftModel, draft: DraftBatch, cache: DynamicCache | None = None
) -> torch.Tensor:
    """Float (B, K*(D+1), hidden): the adapter-on final hidden states of every chunk position,
    drafted against the adapter-off (verifier) KV of the clean sequences (`cache`: their
    `clean_cache`, reused and left as it was; default: computed here)."""
    backbone, depth = model.get_base_model().model, adapter_depth(model)
    cache = clean_cache(model, draft.clean_ids) if cache is None else cache
    with adapter_on(model), first_layers(backbone.config, depth):
        out = backbone(
            input_ids=draft.chunk_ids, position_ids=draft.chunk_positions,
            attention_mask=draft.attention_mask, cache=cache, use_cache=True,
        )
    crop_first_layers(cache, draft.chunk_ids.shape[1], depth)
    return out.last_hidden_state


def labelled_logits(model: PeftModel, draft: DraftBatch) -> torch.Tensor:
    """Float (N, vocab): the drafter's logits at the N labelled positions (row-major order)."""
    hidden = chunk_hidden_states(model, draft)
    with adapter_on(model):  # the output side of the tied mask-token row
        return model.get_base_model().lm_head(hidden[draft.labels != IGNORE]).float()


@dataclass(frozen=True)
class BlockStats:
    """Sums over the labelled positions of a batch (summable across batches and workers)."""

    weighted_loss: torch.Tensor  # sum gamma^j * CE
    weight: torch.Tensor  # sum gamma^j
    correct: torch.Tensor  # top-1 (the mask token excluded, as when drafting) == target
    labelled: torch.Tensor  # positions with a label
    prefix_correct: torch.Tensor  # labelled positions whose block is correct up to and including them
    blocks: torch.Tensor  # blocks with at least one label

    @property
    def loss(self) -> torch.Tensor:
        return self.weighted_loss / self.weight.clamp_min(1e-12)


def block_diffusion_stats(model: PeftModel, draft: DraftBatch, chunk_rows: int = 0) -> BlockStats:
    """Loss and accuracy sums of `draft` (the loss keeps its graph; the rest is detached).

    The logits of the labelled positions are computed `chunk_rows` positions at a time
    (`peftbd.training.chunked_loss`; 0 = all at once), through the adapted tied head
    (`adapted_logits`: the mask row's output side trains too)."""
    base = model.get_base_model()  # adapted_logits: the output side of the tied mask-token row
    return block_stats(chunk_hidden_states(model, draft), draft,
                       lambda h: adapted_logits(base, h), chunk_rows)


def block_stats(hidden: torch.Tensor, draft: DraftBatch, logits_fn: LogitsFn,
                chunk_rows: int = 0) -> BlockStats:
    """`BlockStats` of a block drafter's chunk hidden states `hidden` (B, K*(D+1), d), scored
    with `logits_fn` at the labelled positions, `chunk_rows` at a time (0 = all at once)."""
    sel = draft.labels != IGNORE
    targets = draft.labels[sel]
    weights = draft.weights[sel]
    scores = chunked_scores(hidden[sel], targets, logits_fn,
                            chunk_rows=chunk_rows, weights=weights, exclude_id=draft.mask_id)
    hit = torch.zeros_like(sel)
    hit[sel] = scores.hits  # as the engine: the mask token is never proposed
    labelled = draft.block_view(sel)
    leading = torch.cumprod((draft.block_view(hit) | ~labelled).long(), dim=-1).bool()
    return BlockStats(
        weighted_loss=scores.weighted_ce,
        weight=weights.sum(),
        correct=hit.sum(),
        labelled=sel.sum(),
        prefix_correct=(leading & labelled).sum(),
        blocks=labelled.any(-1).sum(),
    )
