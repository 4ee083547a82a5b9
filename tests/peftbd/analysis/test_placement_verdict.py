"""The placement verdict from hand-made measurements: capacity with its bounds, the deciding
term, the (1 + t_d / t_v) prediction and the goals, in numbers and in words."""

from __future__ import annotations

import pytest

from peftbd.analysis.placement import Devices, LoadRow, PlacementRun
from peftbd.analysis.placement_verdict import (
    Capacity,
    capacity,
    capacity_gain,
    sentence,
    verdict_markdown,
    verdicts,
)

DEVICES = {"colocated": Devices(2, 2), "split": Devices(2, 1)}


def _one(draft: float, sync: float, verify: float, per_round: float = 3.0) -> PlacementRun:
    return PlacementRun(
        requests=1, completion_tokens=0, rounds=0, tokens_per_s=None, tokens_per_round=per_round,
        acceptance_rate=None, prefill_ms_per_request=None, draft_ms_per_round=draft,
        verify_ms_per_round=verify, sync_ms_per_round=sync, other_ms_per_round=None,
        transport_ms_per_round=None, draft_over_verify=None, transport_share=None,
        ingress_http_ms_per_request=None, resumes=0, feature_bytes_per_token=None)


def _row(placement: str, clients: int, client_tps: float, tps: float, transport: float = 0.0,
         batch: float = 1.0, busy: dict[str, float | None] | None = None) -> LoadRow:
    return LoadRow(placement=placement, method="peftbd", concurrency=clients, requests=1,
                   requests_per_s=None, tokens_per_s=tps, tokens_per_s_per_device=tps / 2,
                   client_tokens_per_s=client_tps, p50_ms=0.0, p95_ms=0.0,
                   transport_ms_per_token=transport, mean_batch=batch, busy=busy or {})


def test_capacity_is_the_last_level_above_the_fraction_and_says_when_it_is_a_bound():
    rows = [_row("split", c, t, 0) for c, t in ((1, 100), (4, 80), (16, 49), (32, 20))]
    assert capacity(rows, 0.5) == Capacity(4, censored=False)
    assert capacity(rows, 0.5).floor_tps == 50.0  # half this placement's one-client tok/s
    assert capacity(rows[:2], 0.5) == Capacity(4, censored=True)
    assert capacity([], 0.5) is None


def _measured(split_client_tps: tuple[float, ...]) -> list:
    summary = {"colocated": {"ar": _one(0, 0, 10, 1), "peftbd": _one(10, 0, 10)},
               "split": {"ar": _one(0, 0, 10, 1), "peftbd": _one(10, 5, 10)}}
    rows = [_row("colocated", c, t, 100 * c ** 0.5) for c, t in ((1, 100), (4, 60), (16, 30))]
    rows += [_row("split", c, t, 60 * c ** 0.5, transport=4.0, batch=8.0,
                  busy={"drafter": 0.9, "verifier": 0.5})
             for c, t in zip((1, 4, 16), split_client_tps)]
    return verdicts(summary, rows, DEVICES, 0.5)


def test_the_verdict_names_the_largest_split_only_cost_and_the_prediction():
    [v] = _measured((90, 80, 70))
    assert v.method == "peftbd" and v.clients == 16
    assert v.draft_ms_per_token == pytest.approx((10 / 3, 15 / 3))
    assert v.predicted_capacity == pytest.approx(2.0)  # 1 + 10 / 10
    # colocated's round 10 + 10 on each device; split's paced by its drafter's 10 + 5, over 2
    assert v.overlap_bound == pytest.approx(20 / (2 * 15))
    # transport 4 ms/token, catch-up 5/3, verifier idle (1 - 0.5) * 1000 / 240
    assert v.terms_ms_per_token == pytest.approx({"transport": 4.0, "catch-up": 5 / 3,
                                                   "verifier idle": 500 / 240})
    words = sentence(v)
    assert "largest split-only cost is transport at 4.00 ms" in words
    assert "both split replicas busy >= 80%: missed (drafter 0.90, verifier 0.50)" in words
    assert "tok/s per device >= 0.9x colocated: missed (0.60x, short by 0.30)" in words
    assert ("0.60x colocated's tok/s per device (0.67x if every replica of both were always "
            "busy at one request's round times); ") in words  # no round times per level given
    # split passed every level (a lower bound), colocated's capacity is 4: >= 16 / 1 over 4 / 2
    assert capacity_gain(v) == (pytest.approx(8.0), ">=")
    assert "capacity per verifier device >= 1.5x colocated: met (>= 8.00x)" in words
    assert "each client kept >= 45.0 vs 50.0 tok/s" in words  # half of each one-client rate
    assert "## Verdict" in verdict_markdown([v], 0.5)


def test_a_capacity_that_no_level_bounded_is_undecided_not_a_number():
    [v] = _measured((90, 60, 10))  # split's capacity 4 on 1 verifier, colocated's 4 on 2
    assert capacity_gain(v) == (pytest.approx(2.0), "")
    assert "capacity per verifier device >= 1.5x colocated: met (2.00x)" in sentence(v)
    summary = {"colocated": {"peftbd": _one(10, 0, 10)}, "split": {"peftbd": _one(10, 5, 10)}}
    rows = [_row(p, c, 100, 100) for p in ("colocated", "split") for c in (1, 4)]
    [both] = verdicts(summary, rows, DEVICES, 0.5)
    assert capacity_gain(both) == (pytest.approx(2.0), "unknown")
    assert "undecided" in sentence(both)


def test_a_capacity_at_the_lowest_level_gives_no_ratio():
    rows = [_row("split", c, t, 0) for c, t in ((1, 100), (4, 40), (16, 20))]
    assert capacity(rows, 0.5) == Capacity(1, censored=False, baseline=True)
    summary = {"colocated": {"peftbd": _one(10, 0, 10)}, "split": {"peftbd": _one(10, 5, 10)}}
    rows = [_row(p, c, t, 100) for p in ("colocated", "split") for c, t in ((1, 100), (4, 40))]
    [v] = verdicts(summary, rows, DEVICES, 0.5)
    assert capacity_gain(v) == (None, "unknown") and "undecided" in sentence(v)
