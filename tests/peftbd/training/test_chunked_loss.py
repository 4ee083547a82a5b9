"""Chunked logits + loss: the same loss, gradients and statistics as computing every position's
logits at once, for both objectives; deterministic; the adapted tied head without peft's copy."""

from __future__ import annotations

import pytest
import torch

from peftbd.models.loading import load_tokenizer, load_verifier
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import adapted_logits, adapter_on
from peftbd.training.block_diffusion import block_diffusion_stats, block_starts, build_draft_batch
from peftbd.training.chunked_loss import chunked_scores
from peftbd.training.examples import collate_sequences
from peftbd.training.mtp_objective import mtp_stats

D = 8
ROWS = {
    "id": ["a", "b", "c"],
    "prompt_ids": [[5, 6, 7, 8], [9, 10], [11, 12, 13]],
    "continuation_ids": [list(range(20, 47)), [50, 51, 52], list(range(60, 79))],
    "prompt_len": [4, 2, 3],
}


@pytest.fixture(scope="module")
def ids(tiny_cfg):
    tok = load_tokenizer(tiny_cfg)
    return tok.mask_token_id, tok.pad_token_id


def _grads(module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.requires_grad and p.grad is not None}


def _peftbd_step(model, ids, chunk_rows):
    mask_id, pad_id = ids
    batch = collate_sequences(ROWS, pad_id)
    draft = build_draft_batch(batch, block_starts(batch, D, "random", 0, 0), block_size=D,
                              mask_id=mask_id, pad_id=pad_id, anchored=False, gamma=0.9,
                              t_range=(0.3, 1.0), seed=0, epoch=0)
    model.zero_grad(set_to_none=True)
    stats = block_diffusion_stats(model, draft, chunk_rows)
    stats.loss.backward()
    return stats, _grads(model)


def test_peftbd_chunked_loss_and_gradients_equal_the_unchunked(perturbed_drafter, ids):
    model = perturbed_drafter()
    whole, whole_grads = _peftbd_step(model, ids, chunk_rows=0)
    assert int(whole.labelled) > 7 * 3  # several chunks of 7 below
    chunked, chunked_grads = _peftbd_step(model, ids, chunk_rows=7)
    torch.testing.assert_close(chunked.loss, whole.loss, rtol=1e-5, atol=1e-6)
    for key in ("correct", "labelled", "prefix_correct", "blocks"):
        assert torch.equal(getattr(chunked, key), getattr(whole, key)), key
    assert whole_grads.keys() == chunked_grads.keys()
    assert any("trainable_tokens_delta" in k for k in whole_grads)  # the mask row trains too
    for k in whole_grads:
        torch.testing.assert_close(chunked_grads[k], whole_grads[k], rtol=1e-4, atol=1e-6)
    again, again_grads = _peftbd_step(model, ids, chunk_rows=7)  # deterministic, bit for bit
    assert torch.equal(again.loss, chunked.loss)
    assert all(torch.equal(again_grads[k], chunked_grads[k]) for k in chunked_grads)


def test_adapted_logits_equal_peft_tied_head_with_its_gradient(perturbed_drafter):
    model = perturbed_drafter()
    base = model.get_base_model()
    hidden = torch.randn(5, base.config.hidden_size)
    with adapter_on(model):
        ours = adapted_logits(base, hidden)
        peft = base.lm_head(hidden)
    torch.testing.assert_close(ours, peft, rtol=1e-5, atol=1e-5)
    delta = next(p for n, p in model.named_parameters() if "trainable_tokens_delta" in n)
    grads = []
    for fn in (lambda h: adapted_logits(base, h), base.lm_head):
        delta.grad = None
        with adapter_on(model):
            fn(hidden).square().sum().backward()
        grads.append(delta.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-5)
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(adapted_logits(base, hidden), ours)  # whatever the switch says


WEIGHTS = (0.51, 0.31, 0.18)


def _mtp_step(head, verifier, chunk_rows):
    head.zero_grad(set_to_none=True)
    stats = mtp_stats(head, verifier, collate_sequences(ROWS, 0), WEIGHTS, chunk_rows)
    stats["loss"].backward()
    return stats, _grads(head)


def test_mtp_chunked_loss_and_gradients_equal_the_unchunked(tiny_cfg):
    verifier = load_verifier(tiny_cfg)
    torch.manual_seed(0)
    head = MTPHead(verifier)
    whole, whole_grads = _mtp_step(head, verifier, chunk_rows=0)
    chunked, chunked_grads = _mtp_step(head, verifier, chunk_rows=5)
    torch.testing.assert_close(chunked["loss"], whole["loss"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(chunked["ce_sum"], whole["ce_sum"], rtol=1e-5, atol=1e-5)
    for key in ("targets", "correct", "prefix_correct", "round_targets", "rounds"):
        assert torch.equal(chunked[key], whole[key]), key
    assert whole_grads.keys() == chunked_grads.keys() and whole_grads
    for k in whole_grads:
        torch.testing.assert_close(chunked_grads[k], whole_grads[k], rtol=1e-4, atol=1e-6)
    again, again_grads = _mtp_step(head, verifier, chunk_rows=5)
    assert torch.equal(again["loss"], chunked["loss"])
    assert all(torch.equal(again_grads[k], chunked_grads[k]) for k in chunked_grads)


def test_a_chunk_holds_only_its_own_logits():
    """The LM head sees `chunk_rows` positions per call, in forward and in the recomputation of
    backward: never all N at once."""
    head = torch.nn.Linear(4, 50, bias=False)
    seen: list[int] = []
    head.register_forward_hook(lambda m, a, out: seen.append(out.shape[0]))
    hidden = torch.randn(23, 4, requires_grad=True)
    targets = torch.randint(0, 50, (23,))
    scores = chunked_scores(hidden, targets, head, chunk_rows=10, exclude_id=3)
    scores.weighted_ce.backward()
    assert max(seen) == 10 and sum(seen) == 2 * 23  # forward + recomputed backward, chunk by chunk
    assert scores.hits.shape == (23,)
    seen.clear()  # a single chunk is checkpointed too: its logits do not wait for the backward
    chunked_scores(hidden, targets, head, chunk_rows=64).weighted_ce.backward()
    assert seen == [23, 23]
    with pytest.raises(ValueError, match="chunk_rows=-1"):
        chunked_scores(hidden, targets, head, chunk_rows=-1)
