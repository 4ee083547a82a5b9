"""A verifier device's ms per token at one level, from hand-made measurements: the terms add up
to its wall time, batching is the round forwards against one request at a time, and the verdict
names what split lost most to."""

from __future__ import annotations

import dataclasses

import pytest

from peftbd.analysis.placement import Devices, LoadRow, PlacementRun
from peftbd.analysis.placement_ledger import ledger, level_bound, losses
from peftbd.analysis.placement_verdict import sentence, verdicts


def _one(draft: float, verify: float) -> PlacementRun:
    return PlacementRun(
        requests=1, completion_tokens=0, rounds=0, tokens_per_s=None, tokens_per_round=3.0,
        acceptance_rate=None, prefill_ms_per_request=None, draft_ms_per_round=draft,
        verify_ms_per_round=verify, sync_ms_per_round=0.0, other_ms_per_round=None,
        transport_ms_per_round=None, draft_over_verify=None, transport_share=None,
        ingress_http_ms_per_request=None, resumes=0, feature_bytes_per_token=None)


def _row(placement: str, clients: int, tps: float, batch: float, draft: float, verify: float,
         busy: dict[str, float]) -> LoadRow:
    return LoadRow(placement=placement, method="peftbd", concurrency=clients, requests=clients,
                   requests_per_s=None, tokens_per_s=tps, tokens_per_s_per_device=tps / 2,
                   client_tokens_per_s=tps / clients, p50_ms=0.0, p95_ms=0.0,
                   transport_ms_per_token=1.0, mean_batch=batch, busy=busy,
                   draft_ms_per_round=draft, verify_ms_per_round=verify, sync_ms_per_round=0.0,
                   tokens_per_round=3.0, prefill_ms_per_token=5.0)


COLOCATED = _row("colocated", 16, 20.0, 4.0, 40.0, 20.0, {"engine": 0.9})
SPLIT = _row("split", 16, 30.0, 6.0, 50.0, 30.0, {"drafter": 0.95, "verifier": 0.5})


def test_a_ledger_splits_the_wall_time_per_token_into_its_terms():
    led = ledger(COLOCATED, _one(10.0, 10.0), verifiers=2, split=False)
    assert led is not None
    assert led.wall == pytest.approx(100.0)  # 2 devices x 1000 / 20 tok/s
    assert led.rounds == pytest.approx(60 / 12)  # draft + verify of a batch of 4 over 4 x 3 tokens
    assert led.one_request == pytest.approx(20 / 3)
    assert led.prefill == 5.0 and led.idle == pytest.approx(10.0)
    assert led.other == pytest.approx(80.0)  # busy 90 - rounds 5 - prefill 5
    assert led.rounds + led.prefill + led.other + led.idle == pytest.approx(led.wall)


def test_a_split_verifier_counts_its_verify_only_and_names_its_largest_loss():
    led = ledger(SPLIT, _one(10.0, 10.0), verifiers=1, split=True)
    assert led is not None
    assert led.rounds == pytest.approx(30 / 18) and led.batching == pytest.approx(30 / 18 - 10 / 3)
    assert max(losses(led), key=losses(led).__getitem__) == "idle"
    assert ledger(dataclasses.replace(SPLIT, busy={}), _one(10, 10), 1, True) is None


def test_the_verdict_says_what_split_lost_per_token_against_the_prediction_at_its_batches():
    one = {"colocated": {"peftbd": _one(10.0, 10.0)}, "split": {"peftbd": _one(10.0, 10.0)}}
    rows = [dataclasses.replace(COLOCATED, concurrency=1, requests=1, client_tokens_per_s=3.0,
                                mean_batch=1.0), COLOCATED,
            dataclasses.replace(SPLIT, concurrency=1, requests=1, client_tokens_per_s=3.0,
                                mean_batch=1.0), SPLIT]
    [v] = verdicts(one, rows, {"colocated": Devices(2, 2), "split": Devices(2, 1)}, 0.5)
    colocated, split = v.ledgers
    assert colocated is not None and split is not None
    words = sentence(v)
    assert f"split serves {100 / (1000 / 30):.2f}x colocated's tok/s" in words
    assert f"against {5 / (30 / 18):.2f}x predicted from the round forwards" in words
    assert "(2.00x one request at a time; 1.50x with the prefills" in words  # 1 + t_d / t_v
    assert "split lost most to idle (16.7 ms per token)" in words
    # colocated: 4 x 3 tokens per 40 + 20 ms a device; split: 6 x 3 per its drafter's 50, 2 devices
    assert v.level_bound == pytest.approx((18 / (2 * 50)) / (12 / 60))
    assert "0.90x at those this level ran" in words
    assert level_bound(COLOCATED, dataclasses.replace(SPLIT, draft_ms_per_round=None),
                       Devices(2, 1)) is None
