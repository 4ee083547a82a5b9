"""Drafting ahead's verdict from hand-made measurements: the pre-drafted share, the p50 it
saved against split and the saving predicted, in numbers and in words; the placement verdicts
leave split-ahead out, and the concurrency rows count its pre-drafted rounds."""

from __future__ import annotations

import pytest

from peftbd.analysis.placement import Devices, LoadRow, PlacementRun, RequestRecord, concurrency_summary
from peftbd.analysis.placement_ahead import ahead_markdown, ahead_sentence, ahead_verdicts
from peftbd.analysis.placement_verdict import verdicts
from peftbd.serving.schemas import SpecStats


def _row(placement: str, clients: int, p50: float, pre: float | None = None,
         verify: float = 400.0) -> LoadRow:
    return LoadRow(placement=placement, method="peftbd", concurrency=clients, requests=6,
                   requests_per_s=None, tokens_per_s=10.0, tokens_per_s_per_device=5.0,
                   client_tokens_per_s=10.0, p50_ms=p50, p95_ms=p50, transport_ms_per_token=1.0,
                   mean_batch=1.0, busy={}, draft_ms_per_round=500.0, tokens_per_round=2.5,
                   rounds_per_request=6.0, pre_drafted=pre, verify_ms_per_round=verify,
                   other_ms_per_round=10.0)


def test_the_verdict_reads_the_saving_against_split_at_the_levels_both_ran():
    rows = [_row("split", 1, 6000.0), _row("split", 16, 9000.0), _row("colocated", 1, 5000.0),
            _row("split-ahead", 1, 5200.0, pre=0.25)]
    [v] = ahead_verdicts(rows)
    assert (v.clients, v.p50_ms, v.saved_ms) == (1, (6000.0, 5200.0), 800.0)
    assert v.predicted_saved_ms == pytest.approx(0.25 * 6 * 500)
    words = ahead_sentence(v)
    assert "25% of its rounds" in words and "+800 ms saved" in words and "predicted 750 ms" in words
    assert words.endswith("Goal (lower p50 at 1 client): met.")
    assert v.costs_ms == {"verify": 0.0, "other": 0.0, "transport": 0.0}
    slower = ahead_verdicts([_row("split", 1, 6000.0),
                             _row("split-ahead", 1, 6400.0, pre=0.1, verify=460.0)])
    assert slower[0].costs_ms["verify"] == pytest.approx(60 * 6)
    assert "verify +360 ms" in ahead_sentence(slower[0])
    assert "it lost most to verify. Goal (lower p50 at 1 client): missed." in ahead_sentence(slower[0])
    table = "\n".join(ahead_markdown([v]))
    assert "## Drafting ahead" in table and "| peftbd | 1 | 6000 | 5200 | +800 | 750 | 0.25 |" in table
    assert ahead_markdown([]) == [] and ahead_verdicts(rows[:3]) == []


def test_the_placement_verdicts_leave_split_ahead_to_its_own():
    run = PlacementRun(requests=1, completion_tokens=0, rounds=0, tokens_per_s=None,
                       tokens_per_round=3.0, acceptance_rate=None, prefill_ms_per_request=None,
                       draft_ms_per_round=10.0, verify_ms_per_round=10.0, sync_ms_per_round=0.0,
                       other_ms_per_round=None, transport_ms_per_round=None, draft_over_verify=None,
                       transport_share=None, ingress_http_ms_per_request=None, resumes=0,
                       feature_bytes_per_token=None)
    summary = {p: {"peftbd": run} for p in ("colocated", "split", "split-ahead")}
    rows = [_row(p, 1, 100.0) for p in summary]
    devices = {p: Devices(2, 2 if p == "colocated" else 1) for p in summary}
    assert [v.placement for v in verdicts(summary, rows, devices, 0.5)] == ["split"]


def test_a_level_counts_the_share_of_rounds_drafted_ahead():
    def record(pre: int) -> RequestRecord:
        spec = SpecStats(method="peftbd", rounds=4, pre_drafted_rounds=pre, proposed_tokens=8)
        return RequestRecord("split-ahead", "peftbd", 0, "x", 9, 100.0, spec, 1, 0.0, 1.0)

    [row] = concurrency_summary([record(1), record(2)])
    assert row.pre_drafted == pytest.approx(3 / 8) and row.rounds_per_request == 4.0
