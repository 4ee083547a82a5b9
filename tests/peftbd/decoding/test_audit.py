"""The greedy audit: exact runs pass, a divergence is located and its top-2 margin reported."""

from __future__ import annotations

import torch

from peftbd.decoding import compare, decode, greedy_audit
from peftbd.decoding.audit import first_divergence, top2_margin


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 5]) == 2


def test_audit_passes_for_an_exact_drafter(verifier, prompts, eos, scripted):
    summary = greedy_audit(verifier, prompts[:2], scripted([], block=3, wrong_from=0), 16, eos)
    assert summary == {"prompts": 2, "exact": 2, "exact_pct": 100.0, "mismatches": []}


def test_mismatch_reports_position_and_margin(verifier, prompts):
    pid, ids = prompts[0]
    truth = decode(verifier, ids, None, 8).tokens
    bad = truth[:3] + [(truth[3] + 1) % verifier.config.vocab_size] + truth[4:]
    found = compare(verifier, pid, ids, truth, bad)
    assert (found.prompt_id, found.position, found.ar_token, found.spec_token) == (pid, 3, truth[3], bad[3])
    with torch.inference_mode():
        logits = verifier(input_ids=torch.tensor([ids + truth[:3]])).logits[0, -1]
    top = logits.topk(2).values
    assert found.top2_margin == float(top[0] - top[1]) > 0
    assert top2_margin(verifier, ids + truth[:3]) == found.top2_margin
