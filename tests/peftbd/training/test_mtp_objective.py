"""The FastMTP objective: which positions are trained, batching invariance, and that step 1 is
aligned exactly as the engine drafts."""

from __future__ import annotations

import pytest
import torch

from peftbd.decoding.mtp_drafter import MTPDrafter
from peftbd.decoding.verify import prefill
from peftbd.models.loading import load_verifier
from peftbd.models.mtp_head import MTPHead
from peftbd.training.examples import collate_sequences
from peftbd.training.mtp_objective import mtp_stats

WEIGHTS = (0.51, 0.31, 0.18)
ROWS = {
    "id": ["a", "b"],
    "prompt_ids": [[5, 6, 7, 8, 9], [11, 12]],
    "continuation_ids": [list(range(20, 32)), [40, 41, 42]],
    "prompt_len": [5, 2],
}


@pytest.fixture(scope="module")
def verifier(tiny_cfg):
    return load_verifier(tiny_cfg)


@pytest.fixture(scope="module")
def head(verifier):
    torch.manual_seed(0)
    return MTPHead(verifier)


def _subset(i: int) -> dict:
    return {k: v[i : i + 1] for k, v in ROWS.items()}


@torch.no_grad()
def test_only_continuation_targets_count(head, verifier):
    stats = mtp_stats(head, verifier, collate_sequences(ROWS, 0), WEIGHTS)
    # step k (1-based) at index i predicts y_{i+k+1}: targets y_j with max(P, k+1) <= j < n
    expected = [sum(max(0, n - max(p, k + 1)) for p, n in ((5, 17), (2, 5))) for k in (1, 2, 3)]
    assert stats["targets"].tolist() == expected
    # rounds: indices whose first target (i + 2) is a continuation token
    assert int(stats["rounds"]) == (17 - 5) + (5 - 2)


@torch.no_grad()
def test_a_batch_sums_its_rows(head, verifier):
    both = mtp_stats(head, verifier, collate_sequences(ROWS, 0), WEIGHTS)
    alone = [mtp_stats(head, verifier, collate_sequences(_subset(i), 0), WEIGHTS) for i in (0, 1)]
    for key in ("targets", "correct", "prefix_correct", "round_targets", "rounds"):
        assert torch.equal(both[key], alone[0][key] + alone[1][key])
    torch.testing.assert_close(both["ce_sum"], alone[0]["ce_sum"] + alone[1]["ce_sum"])


@torch.no_grad()
def test_step_one_is_the_engine_first_draft(head, verifier):
    prompt = ROWS["prompt_ids"][0]
    state = prefill(verifier, prompt, max_new_tokens=16)
    drafter = MTPDrafter(head, verifier, num_steps=3)
    drafter.start(state)
    captured = []
    logits = head.logits
    head.logits = lambda hidden: captured.append(logits(hidden)) or captured[-1]
    try:
        drafter.propose([state], [3])
        engine = captured[0][0, -1]  # step 1 at the last committed position
    finally:
        del head.logits
    steps = []  # training computes each step's hidden output (head.step), then its logits in chunks
    step = head.step
    head.step = lambda *a, **k: steps.append(step(*a, **k)) or steps[-1]
    try:
        seq = {"id": ["x"], "prompt_ids": [state.tokens], "continuation_ids": [[1, 1, 1]],
               "prompt_len": [len(state.tokens)]}
        mtp_stats(head, verifier, collate_sequences(seq, 0), WEIGHTS, chunk_rows=2)
    finally:
        del head.step
    # teacher-forced step 1 at index i uses (h_i, y_{i+1}); the engine's first draft after
    # committing y_t uses (h_{t-1}, y_t): index t - 1 = len(prompt) - 1 + 1 - 1
    trained = head.logits(steps[0])[0, len(state.tokens) - 2]
    torch.testing.assert_close(trained, engine, atol=1e-4, rtol=1e-4)
