"""The placement report: transport separated from compute, exactness across placements, the table."""

from __future__ import annotations

import pytest

from peftbd.analysis.placement import (
    RequestRecord,
    concurrency_summary,
    markdown,
    one_at_a_time,
    outputs_identical,
    summarize,
)
from peftbd.serving.schemas import SpecStats


def _record(placement: str, method: str, prompt: int, text: str = "t") -> RequestRecord:
    spec = SpecStats(method=method, rounds=4, proposed_tokens=8, accepted_tokens=2, prefill_ms=5.0,
                     draft_ms=8.0, verify_ms=10.0, sync_ms=2.0, other_ms=1.0, transport_ms=20.0)
    return RequestRecord(placement, method, prompt, text, completion_tokens=7, wall_ms=100.0, spec=spec)


def test_summary_separates_transport_from_compute():
    records = [_record("split", "peftbd", i) for i in range(2)] + [_record("colocated", "ar", 0)]
    row = summarize(records)["split"]["peftbd"]
    assert (row.requests, row.rounds, row.completion_tokens) == (2, 8, 14)
    assert row.tokens_per_s == pytest.approx(14 / 0.2)
    assert row.tokens_per_round == pytest.approx((14 - 2) / 8)
    assert row.transport_ms_per_round == pytest.approx(40 / 8)
    assert row.draft_ms_per_round == pytest.approx(16 / 8)
    assert row.draft_over_verify == pytest.approx((16 + 4) / 20)
    assert row.ingress_http_ms_per_request == pytest.approx(100 - 46)
    assert "| split | peftbd |" in markdown(summarize(records), {"x": "why"}, ["note"])


def test_outputs_identical_compares_each_prompt_across_placements():
    same = [_record("split", "ar", 0, "a"), _record("colocated", "fastmtp", 0, "a")]
    assert outputs_identical(same)
    assert not outputs_identical(same + [_record("split", "peftbd", 0, "b")])


def test_head_rows_report_the_feature_bytes_per_token():
    head = _record("split", "peftbd_head", 0)
    head.spec.feature_bytes = 7 * 1536
    summary = summarize([head, _record("split", "fastmtp", 0)])
    assert summary["split"]["peftbd_head"].feature_bytes_per_token == pytest.approx(1536)
    assert summary["split"]["fastmtp"].feature_bytes_per_token == 0  # none sent
    table = markdown(summary, {}, [])
    assert "| split | peftbd_head |" in table and "shipped bytes/token" in table


def test_concurrency_rows_use_the_runs_wall_time_and_latency_quantiles():
    """4 requests one at a time over 0.4 s vs 4 at once over 0.1 s: 4x tokens/s; transport per
    token from the requests' shares; p50 / p95 of the client latencies."""
    records = []
    for conc, starts in ((1, [0.0, 0.1, 0.2, 0.3]), (4, [0.0] * 4)):
        for i, t in enumerate(starts):
            r = _record("colocated", "ar", i)
            r.concurrency, r.start_s, r.end_s, r.wall_ms = conc, t, t + 0.1, 100.0 + i
            r.spec.mean_batch_size = float(conc)
            records.append(r)
    rows = concurrency_summary(records)
    assert [(r.concurrency, r.requests) for r in rows] == [(1, 4), (4, 4)]
    low, high = rows
    assert low.tokens_per_s == pytest.approx(28 / 0.4) and high.speedup == pytest.approx(4)
    assert high.requests_per_s == pytest.approx(40)
    assert high.transport_ms_per_token == pytest.approx(80 / 28, abs=1e-4)
    assert high.p50_ms == 101.5 and high.p95_ms == pytest.approx(102.85, abs=0.06)
    assert high.mean_batch == 4
    assert one_at_a_time(records) == records[:4]
    table = markdown(summarize(one_at_a_time(records)), {}, [], rows)
    assert "## Client concurrency" in table and "| colocated | ar | 4 |" in table
