"""Run metrics: each definition on hand-made rounds."""

from __future__ import annotations

import pytest

from peftbd.decoding import DecodeResult, RoundMetrics, summarize


def test_summary_definitions():
    rounds = [
        RoundMetrics(proposed=4, accepted=4, emitted=5, draft_ms=10, verify_ms=10, other_ms=0),
        RoundMetrics(proposed=4, accepted=1, emitted=2, draft_ms=10, verify_ms=10, other_ms=0),
        RoundMetrics(proposed=2, accepted=0, emitted=1, draft_ms=6, verify_ms=10, other_ms=4),
    ]
    a = DecodeResult(tokens=list(range(9)), rounds=rounds, prefill_s=0.02,
                     forward_calls={"draft": 3, "verify": 3}, forward_seconds={"draft": 0.03, "verify": 0.03})
    ar = DecodeResult(tokens=[1, 2], rounds=[RoundMetrics(0, 0, 1, verify_ms=10)], prefill_s=0.01,
                      forward_calls={"verify": 1}, forward_seconds={"verify": 0.01})
    m = summarize([a, ar])
    assert m["prompts"] == 2 and m["new_tokens"] == 11 and m["rounds"] == 4
    assert m["decode_s"] == pytest.approx(0.03 + 0.07)  # prefills + rounds
    assert m["tokens_per_s"] == pytest.approx(11 / 0.1)
    assert m["mean_accepted"] == pytest.approx(9 / 4)  # bonus included: the paper's tokens/step
    assert m["mean_accepted_prefix"] == pytest.approx(5 / 4)
    assert m["token_acceptance"] == pytest.approx(5 / 10)  # over rounds that drafted
    assert m["block_acceptance"] == pytest.approx(1 / 3)
    pos = m["per_position"]  # drafted rounds (4, 4), (4, 1), (2, 0); AR's round proposes nothing
    assert pos["proposed"] == [3, 3, 2, 2] and pos["accepted"] == [2, 1, 1, 1]
    assert pos["reached"] == [3, 2, 1, 1]  # proposed j and accepted 1..j-1
    assert pos["rate"] == pytest.approx([2 / 3, 1 / 3, 1 / 2, 1 / 2])  # (2, 0) stops at 2
    assert pos["conditional"] == pytest.approx([2 / 3, 1 / 2, 1, 1])
    assert sum(pos["accepted"]) == 5 and sum(pos["proposed"]) == 10
    assert m["forward"] == {"draft": {"calls": 3, "mean_ms": pytest.approx(10)},
                            "verify": {"calls": 4, "mean_ms": pytest.approx(10)}}
    assert m["round"]["t0_s"] == pytest.approx(0.07 / 4)
    assert m["round"]["draft_share"] == pytest.approx(26 / 70)
    assert m["round"]["verify_share"] + m["round"]["draft_share"] + m["round"]["other_share"] == pytest.approx(1)
    # throughput at the measured round time is the oracle's r = 0 point
    assert m["mean_accepted"] / m["round"]["t0_s"] == pytest.approx(9 / 0.07)


def test_ar_run_has_no_acceptance_rates():
    m = summarize([DecodeResult(tokens=[1], rounds=[], prefill_s=0.01)])
    assert m["token_acceptance"] is None and m["block_acceptance"] is None and m["mean_accepted"] is None
    assert m["per_position"] == dict.fromkeys(("proposed", "reached", "accepted", "rate", "conditional"), [])
    assert m["tokens_per_s"] == pytest.approx(100)


def test_a_round_whose_output_ended_inside_its_draft():
    """(4, 2, 2): EOS (or the budget) at draft position 2; positions 3-4 were proposed, never
    judged: not reached, not accepted."""
    ended = RoundMetrics(proposed=4, accepted=2, emitted=2)
    rejected = RoundMetrics(proposed=4, accepted=2, emitted=3)  # position 3 judged and rejected
    assert ended.ended_in_draft and not rejected.ended_in_draft
    pos = summarize([DecodeResult(tokens=list(range(6)), rounds=[ended, rejected])])["per_position"]
    assert pos["proposed"] == [2, 2, 2, 2] and pos["accepted"] == [2, 2, 0, 0]
    assert pos["reached"] == [2, 2, 1, 0]
    assert pos["conditional"] == [1.0, 1.0, 0.0, None] and pos["rate"] == [1.0, 1.0, 0.0, 0.0]
