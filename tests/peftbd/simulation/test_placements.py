"""Placements on simulated devices: one request's time is the sum of its parts, a split
Verifier's two groups overlap drafting with verifying, a shared device is one device, and a
measured run fitted and replayed (here: a run the simulator made with a known cost) comes back
level by level."""

from __future__ import annotations

import pytest

from peftbd.analysis.placement import one_at_a_time, summarize
from peftbd.analysis.placement_verdict import PlacementReport
from peftbd.decoding.controlled import AcceptanceProfile
from peftbd.simulation.fitted_cost import FittedCost, Line
from peftbd.simulation.placements import SimMethod, SimSetup, simulate_level
from peftbd.simulation.shapes import ForwardShape
from peftbd.simulation.study import Simulated, replay, run_levels

AR = SimMethod("ar", "ar", 0, None)
PEFTBD = SimMethod("peftbd", "peftbd", 8, AcceptanceProfile.with_mean(2.5, 8))
PROMPTS = [[p + 1] * (10 + 3 * p) for p in range(6)]


class _Flat:
    name = "flat"

    def __init__(self, draft: float = 2.0, verify: float = 3.0, hop: float = 0.0,
                 per_row: bool = False) -> None:
        self.draft, self.verify, self.hop, self.per_row = draft, verify, hop, per_row

    def forward_ms(self, shape: ForwardShape) -> float:
        ms = {"prefill": 1.0, "draft": self.draft, "verify": self.verify}[shape.kind]
        return ms * shape.rows if self.per_row else ms

    def hop_ms(self, payload_bytes: int) -> float:
        return self.hop


def test_one_request_alone_takes_ingress_batch_wait_prefill_and_its_rounds():
    setup = SimSetup("colocated", _Flat(), max_batch=4, batch_wait_ms=2.0, prefill_chunk=512,
                     engines=1, ingress_ms=5.0)
    records, window = simulate_level(setup, AR, PROMPTS, [9] * 6, [0], 1)
    (r,) = records
    assert r.completion_tokens == 9 and r.spec.rounds == 8
    assert r.wall_ms == pytest.approx(5.0 + 2.0 + 1.0 + 8 * 3.0)
    assert window.busy == {"engine": [pytest.approx((1.0 + 8 * 3.0) / r.wall_ms)]}


def test_two_groups_overlap_drafting_with_verifying_on_a_split_pair():
    """Forwards costing per row: two groups of half the rows keep both devices busy (one
    group's lockstep leaves each idle while the other works)."""
    def tok_s(groups: int) -> float:
        setup = SimSetup("split", _Flat(5.0, 5.0, 1.0, per_row=True), 8, 0.0, 512, groups=groups)
        records, _ = simulate_level(setup, PEFTBD, PROMPTS, [40] * 6, list(range(6)) * 2, 4)
        wall = max(r.end_s for r in records) - min(r.start_s for r in records)
        return sum(r.completion_tokens for r in records) / wall

    assert tok_s(2) > 1.3 * tok_s(1)


def test_a_split_pair_on_one_shared_device_is_busy_as_one_device():
    setup = SimSetup("split", _Flat(), 8, 2.0, 512, shared_device=True)
    _, window = simulate_level(setup, PEFTBD, PROMPTS, [30] * 6, list(range(6)), 3)
    assert setup.devices == 1 and setup.verifier_devices == 1
    assert window.busy["drafter"] == window.busy["verifier"]
    assert 0.5 < window.busy["verifier"][0] <= 1.0


def test_a_line_fits_exactly_and_never_slopes_down():
    assert Line.fit([(1, 5.0), (2, 7.0), (4, 11.0)]) == Line(3.0, 2.0)
    assert Line.fit([(1, 5.0), (1, 7.0)]) == Line(6.0, 0.0)
    assert Line.fit([(1, 9.0), (4, 3.0)]).slope == 0.0
    with pytest.raises(ValueError, match="no measured point"):
        Line.fit([])


def test_a_run_fitted_and_replayed_comes_back_level_by_level():
    """A "measured" run made by the simulator on a known cost (linear in rows, with hops and
    ingress) is fitted and replayed: every level's tok/s per device and p50 within 5%."""
    truth = {"colocated": FittedCost("truth", Line(4.0, 1.5), Line(6.0, 2.0), 0.05, 0.0, 0.0, 3.0),
             "split": FittedCost("truth", Line(4.0, 1.5), Line(6.0, 2.0), 0.05, 1.5, 0.0, 3.0)}
    outputs = [24 + 4 * p for p in range(len(PROMPTS))]
    measured = Simulated("truth")
    for placement, cost in truth.items():
        setup = SimSetup(placement, cost, 8, 2.0, 64, groups=2, ingress_ms=cost.ingress_ms)
        run_levels(measured, setup, PEFTBD, PROMPTS, outputs,
                   [(c, list(range(len(PROMPTS))) * 3) for c in (1, 2, 4, 8)])
    report = PlacementReport(
        summary=summarize(one_at_a_time(measured.records)), concurrency=measured.rows(),
        skipped={}, notes=[], devices=measured.devices, verdicts=[], outputs_identical=True,
        requests=measured.records)
    simulated, costs = replay([report], PROMPTS, {"peftbd": 8}, 8, 2.0, 64, 2, "test run")
    for clients in (1, 2, 4, 8):
        assert costs["split", "peftbd", clients].hop_per_round_ms == pytest.approx(1.5, rel=0.05)
        assert costs["colocated", "peftbd", clients].ingress_ms == pytest.approx(3.0, rel=0.05)
        assert costs["split", "peftbd", clients].verify.at(3) == pytest.approx(12.0, rel=0.05)
    want = {(r.placement, r.concurrency): r for r in report.concurrency}
    got = {(r.placement, r.concurrency): r for r in simulated.rows()}
    assert got.keys() == want.keys()
    for key, row in want.items():
        assert got[key].tokens_per_s_per_device == pytest.approx(row.tokens_per_s_per_device, rel=0.05), key
        assert got[key].p50_ms == pytest.approx(row.p50_ms, rel=0.05), key


def test_drafting_ahead_hides_the_draft_behind_the_verify_when_its_guess_holds():
    """Every round accepts exactly 2 (a profile of certain rates): the first round has no history
    (guess 0), the second guesses 2, so from the third round on every round takes its pre-draft,
    and one client's request ends sooner than split's;
    with two groups busy the Drafter never drafts ahead (the step loop's `solo`)."""
    sure = SimMethod("peftbd", "peftbd", 8, AcceptanceProfile((1.0, 1.0, 0.0), "exactly 2"),
                     drafts_ahead=True)

    def run(placement: str, clients: int) -> list:
        setup = SimSetup(placement, _Flat(10.0, 10.0, 1.0), 8, 0.0, 512, groups=2)
        return simulate_level(setup, sure, PROMPTS, [31] * 6, list(range(6)), clients)[0]

    split, ahead = run("split", 1), run("split-ahead", 1)
    assert all(r.spec.pre_drafted_rounds == r.spec.rounds - 2 for r in ahead)
    assert all(r.spec.pre_drafted_rounds == 0 for r in split)
    assert sum(r.wall_ms for r in ahead) < 0.75 * sum(r.wall_ms for r in split)
    assert all(r.spec.pre_drafted_rounds == 0 for r in run("split-ahead", 4))
