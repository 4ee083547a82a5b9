"""The block-diffusion objective: block cutting (aligned and at random offsets), noise, the
linear-prefix loss, and that training drafts exactly like the engine at every offset (same
chunks, same attention pattern, same logits)."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from peftbd.decoding.peft_bd_drafter import PeftBDDrafter
from peftbd.decoding.verify import advance, prefill
from peftbd.models.early_exit import adapter_depth, first_layers
from peftbd.models.loading import load_tokenizer
from peftbd.models.peft_bd import adapter_on, draft_attention_mask, draft_position_ids
from peftbd.training.block_diffusion import (
    IGNORE,
    block_diffusion_stats,
    block_offset,
    block_starts,
    build_draft_batch,
    chunk_hidden_states,
    labelled_logits,
    noise_generator,
    prefix_weights,
    sample_block_mask,
)
from peftbd.training.examples import collate_sequences

D = 8
ROWS = {  # continuation lengths 20 (2 full blocks + 4), 3 (shorter than D), 16 (2 full blocks)
    "id": ["a", "b", "c"],
    "prompt_ids": [[5, 6, 7, 8], [9, 10], [11, 12, 13]],
    "continuation_ids": [list(range(20, 40)), [50, 51, 52], list(range(60, 76))],
    "prompt_len": [4, 2, 3],
}


@pytest.fixture(scope="module")
def ids(tiny_cfg):
    tok = load_tokenizer(tiny_cfg)
    return tok.mask_token_id, tok.pad_token_id


@pytest.fixture(scope="module", params=[0, 1], ids=["whole-backbone", "early-exit-1"])
def drafter(request, perturbed_drafter):
    """A drafter whose adapter visibly changes the outputs: a whole-backbone one, and an
    early-exit one drafting from the first layer."""
    return perturbed_drafter(draft_layers=request.param)


def _draft(ids, rows=ROWS, t_range=(0.3, 1.0), anchored=False, epoch=0, gamma=0.9, offsets="aligned"):
    mask_id, pad_id = ids
    batch = collate_sequences(rows, pad_id)
    return build_draft_batch(
        batch, block_starts(batch, D, offsets, 0, epoch), block_size=D, mask_id=mask_id,
        pad_id=pad_id, anchored=anchored, gamma=gamma, t_range=t_range, seed=0, epoch=epoch,
    )


def _epoch_with_offset(offset: int, row_id: str) -> int:
    """The first epoch in which `row_id`'s random blocks start at `offset` (seed 0)."""
    return next(e for e in range(1000) if block_offset(0, e, row_id, D) == offset)


def test_blocks_start_at_the_continuation_and_the_last_is_padded_with_masks(ids):
    mask_id, _ = ids
    draft = _draft(ids, t_range=(1.0, 1.0))
    assert draft.num_blocks == 3
    labels = draft.block_view(draft.labels)
    assert labels[0, 0].tolist() == list(range(20, 28))
    assert labels[0, 2].tolist() == [36, 37, 38, 39] + [IGNORE] * 4  # partial: no loss past the end
    assert labels[1, 0].tolist() == [50, 51, 52] + [IGNORE] * 5  # shorter than D: one padded block
    assert (labels[1, 1:] == IGNORE).all() and (labels[2, 2] == IGNORE).all()  # dummy chunks
    chunks = draft.chunk_ids.view(3, 3, D + 1)
    assert chunks[0, 0, 0] == 8 and chunks[0, 1, 0] == 27  # x_{s-1}: last prompt token, then block end
    assert (chunks[0, :, 1:] == mask_id).all()  # t = 1: every block position is a mask
    assert draft.chunk_positions.view(3, 3, D + 1)[0, 1].tolist() == list(range(11, 20))


def test_aligned_blocks_are_the_blocks_of_before_block_offsets_existed(ids):
    draft = _draft(ids)
    digest = hashlib.sha256()
    for t in (draft.chunk_ids, draft.chunk_positions, draft.labels, draft.weights, draft.attention_mask):
        digest.update(t.contiguous().numpy().tobytes())
    # the same chunks, noise, labels, weights and mask as the aligned-only code produced
    assert digest.hexdigest() == "b9b664d245035c224195863b6aeb95e3ec561af9341cf3654b9c64104f29aa2e"


def test_random_blocks_start_after_the_first_reply_token_at_the_rows_offset(ids):
    batch = collate_sequences(ROWS, ids[1])
    for epoch in range(4):
        starts = block_starts(batch, D, "random", 0, epoch)
        for r, row_id in enumerate(ROWS["id"]):
            p, n = int(batch.prompt_lens[r]), int(batch.lengths[r])
            o = block_offset(0, epoch, row_id, D)
            assert starts[r] == list(range(p + 1 + o, n, D))  # y_P is never drafted (prefill commits it)
    assert block_starts(batch, D, "aligned", 0, 3) == [[4, 12, 20], [2], [3, 11]]


def test_block_offsets_are_a_function_of_seed_epoch_and_row():
    assert block_offset(0, 5, "a", D) == block_offset(0, 5, "a", D)
    per_epoch = [block_offset(0, e, "a", D) for e in range(64)]
    assert per_epoch != [per_epoch[0]] * 64 and set(per_epoch) == set(range(D))  # every offset comes
    rows = [f"r{i}" for i in range(64)]
    assert [block_offset(0, 0, r, D) for r in rows] != [block_offset(0, 1, r, D) for r in rows]
    assert [block_offset(0, 0, r, D) for r in rows] != [block_offset(1, 0, r, D) for r in rows]


def test_noise_masks_round_t_times_valid_and_is_a_function_of_seed_epoch_and_row():
    gen = torch.Generator().manual_seed(0)
    for valid in (1, 3, 8):
        for _ in range(20):
            masked = sample_block_mask(valid, D, 0.3, 1.0, gen)
            assert masked[valid:].all()
            assert 1 <= int(masked[:valid].sum()) <= valid
    assert sample_block_mask(5, D, 1.0, 1.0, gen).all()
    draws = [torch.rand(4, generator=noise_generator(0, e, r)) for e, r in [(0, "a"), (0, "a"), (1, "a"), (0, "b")]]
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], draws[2]) and not torch.equal(draws[0], draws[3])


@pytest.mark.parametrize("offsets", ["aligned", "random"])
def test_blocks_and_noise_of_a_row_do_not_depend_on_its_batch(ids, offsets):
    alone = _draft(ids, rows={k: v[:1] for k, v in ROWS.items()}, offsets=offsets)
    batched = _draft(ids, offsets=offsets)
    width = alone.chunk_ids.shape[1]
    assert torch.equal(alone.chunk_ids[0], batched.chunk_ids[0, :width])
    assert torch.equal(alone.chunk_positions[0], batched.chunk_positions[0, :width])
    assert torch.equal(alone.labels[0], batched.labels[0, :width])
    assert torch.equal(_draft(ids, offsets=offsets).labels, batched.labels)  # deterministic
    assert not torch.equal(_draft(ids, epoch=1, offsets=offsets).chunk_ids, batched.chunk_ids)


def test_prefix_weights_are_gamma_to_the_block_position():
    assert torch.allclose(prefix_weights(4, 0.9), torch.tensor([1.0, 0.9, 0.81, 0.729]))


@torch.no_grad()
def test_loss_is_the_gamma_weighted_mean_over_masked_positions(drafter, ids):
    draft = _draft(ids)
    stats = block_diffusion_stats(drafter, draft)
    logits = labelled_logits(drafter, draft)
    sel = draft.labels != IGNORE
    ce = F.cross_entropy(logits, draft.labels[sel], reduction="none")
    j = (torch.arange(draft.labels.shape[1]) % (D + 1) - 1).expand_as(sel)[sel]
    expected = (0.9 ** j * ce).sum() / (0.9 ** j).sum()
    assert torch.allclose(stats.loss, expected)
    assert int(stats.labelled) == int(sel.sum()) < 20 + 3 + 16  # t < 1 leaves some tokens visible


@torch.no_grad()
def _plain_block_logits(model, seq: torch.Tensor, s: int, chunk: torch.Tensor, anchored: bool):
    """The reference: one block alone, the verifier cache of seq[:s-1], then the adapter-on chunk."""
    base = model.get_base_model()
    cache = DynamicCache()
    base(input_ids=seq[None, : s - 1], cache=cache)
    with adapter_on(model), first_layers(base.config, adapter_depth(model)):
        return base(
            input_ids=chunk[None], cache=cache, position_ids=draft_position_ids(s - 1, D),
            attention_mask=draft_attention_mask(s - 1, D, anchored, torch.float32),
        ).logits[0]


@pytest.mark.parametrize("offsets", ["aligned", "random"])
@pytest.mark.parametrize("anchored", [False, True])
@torch.no_grad()
def test_one_forward_over_all_blocks_equals_the_plain_per_block_forward(drafter, ids, anchored, offsets):
    draft = _draft(ids, anchored=anchored, offsets=offsets)
    hidden = chunk_hidden_states(drafter, draft)
    with adapter_on(drafter):  # the tied output row of the mask token is adapted too
        all_blocks = drafter.get_base_model().lm_head(hidden)
    batch = collate_sequences(ROWS, ids[1])
    starts = block_starts(batch, D, offsets, 0, 0)
    for r, row_starts in enumerate(starts):
        for k, s in enumerate(row_starts):
            rows = slice(k * (D + 1), (k + 1) * (D + 1))
            plain = _plain_block_logits(drafter, batch.ids[r], s, draft.chunk_ids[r, rows], anchored)
            torch.testing.assert_close(all_blocks[r, rows], plain, atol=1e-4, rtol=1e-4)
    assert sum(map(len, starts)) >= 4  # blocks of several rows were compared


def _engine_draft(drafter, state, mask_id):
    """The engine's draft from `state`: the logits of its D block positions (from the output
    projection `draft_logits` reads) and its proposal."""
    captured = []
    head = drafter.get_base_model().get_output_embeddings()
    head = head.token_adapter.base_layer if hasattr(head, "token_adapter") else head
    hook = head.register_forward_hook(lambda m, a, out: captured.append(out.clone()))
    try:
        proposal = PeftBDDrafter(drafter, mask_id, D).propose([state], [D])[0]
    finally:
        hook.remove()
    return captured[0].reshape(D, -1).float(), proposal[0].tolist()  # (D, vocab): the one draft forward


def _assert_same_draft(train_logits, engine_logits, proposal, mask_id):
    keep = torch.arange(train_logits.shape[-1]) != mask_id  # the mask column: no draft proposes it
    torch.testing.assert_close(train_logits[:, keep], engine_logits[:, keep], atol=1e-4, rtol=1e-4)
    train_logits[:, mask_id] = -math.inf
    assert train_logits.argmax(-1).tolist() == proposal


PROMPT = [5, 17, 300, 21, 42, 99, 64, 7, 12]


@torch.no_grad()
def test_aligned_training_logits_at_t1_equal_the_engine_draft_forward(drafter, ids):
    mask_id, _ = ids
    state = prefill(drafter, PROMPT, max_new_tokens=32, eos_ids=())
    engine_logits, proposal = _engine_draft(drafter, state, mask_id)
    tokens = list(state.tokens)  # prompt + the first committed token; the block starts after it
    rows = {"id": ["x"], "prompt_ids": [tokens], "continuation_ids": [[1] * D], "prompt_len": [len(tokens)]}
    draft = _draft(ids, rows=rows, t_range=(1.0, 1.0))
    _assert_same_draft(labelled_logits(drafter, draft), engine_logits, proposal, mask_id)


@pytest.mark.parametrize("offset", range(D))
@torch.no_grad()
def test_random_training_blocks_at_t1_equal_the_engine_draft_at_every_offset(drafter, ids, offset):
    """The engine's round that drafts from P+1+offset (prefill committed y_P, then `offset` more
    tokens) and the random recipe's block at that offset: the same logits, the same proposal."""
    mask_id, _ = ids
    state = prefill(drafter, PROMPT, max_new_tokens=32, eos_ids=())
    if offset:
        advance(drafter, state, list(range(100, 100 + offset)))  # the rounds so far committed these
    engine_logits, proposal = _engine_draft(drafter, state, mask_id)
    reply = state.tokens[len(PROMPT):] + [1] * D  # the committed reply, then the block's D targets
    rows = {"id": ["x"], "prompt_ids": [PROMPT], "continuation_ids": [reply], "prompt_len": [len(PROMPT)]}
    draft = _draft(ids, rows=rows, t_range=(1.0, 1.0), offsets="random",
                   epoch=_epoch_with_offset(offset, "x"))
    assert draft.num_blocks == 1 and int(draft.chunk_positions[0, 0]) == len(state.tokens) - 1
    _assert_same_draft(labelled_logits(drafter, draft), engine_logits, proposal, mask_id)
