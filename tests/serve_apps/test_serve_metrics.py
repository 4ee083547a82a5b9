"""The dashboard's means are exact: known rounds go through `RoundMetrics` (Ray's metric classes
replaced by recorders) and every mean panel of grafana_dashboard.json, evaluated on the recorded
counter totals, gives the rounds' true mean (AR: exactly 1 token per round; colocated: sync 0)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from peftbd.serving.rounds import RoundEvent
from serve_apps import metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "serve_apps" / "grafana_dashboard.json"
SERIES = re.compile(r"sum by \(placement, method\) \(rate\((ray_\w+)\{[^}]*\}\[\$__rate_interval\]\)\)")


class Recorder:
    """Stands in for Ray's Counter and Histogram: totals per (Prometheus name, tags)."""

    totals: dict[tuple[str, str, str], float] = defaultdict(float)

    def __init__(self, name: str, **_: object) -> None:
        self.name = name

    def inc(self, value: float = 1.0, tags: dict | None = None) -> None:
        assert value > 0, "Ray's counters refuse increments <= 0"
        self.totals[(f"ray_{self.name}_total", tags["placement"], tags["method"])] += value

    def observe(self, value: float, tags: dict | None = None) -> None:
        pass  # histograms feed the quantile panels only


ROUNDS = {  # (placement, method) -> rounds: (tokens, draft_ms, verify_ms, sync_ms, transport_ms)
    ("colocated", "ar"): [(1, 0.0, 3.0, 0.0, 0.4)] * 5,
    ("split", "fastmtp"): [(2, 1.0, 4.0, 0.5, 2.0), (3, 2.0, 5.0, 0.5, 3.0), (4, 3.0, 6.0, 0.5, 4.0)],
    ("split", "peftbd_head"): [(1, 1.0, 4.0, 0.1, 2.0), (4, 1.0, 5.0, 0.1, 3.0)],
}
ROW = 2 * 192 * 4  # feature bytes per position (tiny: 2 layers x 192 x float32)
PROMPT = 30


def _feature_bytes(method: str, positions: int) -> int:
    """What the verifier sends a split head drafter: features of every newly cached position."""
    return positions * ROW if method == "peftbd_head" else 0


@pytest.fixture
def recorded(monkeypatch):
    monkeypatch.setattr(metrics, "Counter", Recorder)
    monkeypatch.setattr(metrics, "Histogram", Recorder)
    Recorder.totals.clear()
    for (placement, method), rounds in ROUNDS.items():
        m = metrics.RoundMetrics(placement)
        m.observe(RoundEvent(tokens=[7], other_ms=9.0, prefill=True), method)  # not a round
        shipped = PROMPT  # the first round's propose carries every prompt position's
        for tokens, draft, verify, sync, transport in rounds:
            m.observe(RoundEvent(tokens=[7] * tokens, proposed=3, accepted=tokens - 1,
                                 draft_ms=draft, verify_ms=verify, sync_ms=sync,
                                 transport_ms=transport,
                                 feature_bytes=_feature_bytes(method, shipped)), method)
            shipped = tokens
    return dict(Recorder.totals)


def _evaluate(expr: str, totals: dict, placement: str, method: str) -> float:
    """The PromQL of a panel on counter totals of one (placement, method): a series that was never
    incremented is missing (None), so `A or B * 0` reads it as 0, as Prometheus does."""
    python = SERIES.sub(lambda m: f"v({m[1]!r})", expr)
    assert "ray_" not in python.replace("v('ray_", ""), f"unparsed series in {expr}"
    return eval(python, {"v": lambda name: totals.get((name, placement, method))})  # noqa: S307


def _panel(title_start: str) -> str:
    dash = json.loads(DASHBOARD.read_text())
    (panel,) = [p for p in dash["panels"] if p["title"].startswith(title_start)]
    return panel["targets"][0]["expr"]


@pytest.mark.parametrize(("title", "column"), [
    ("Tokens per round", 0), ("Draft time", 1), ("Verify time", 2), ("State sync", 3),
    ("Transport", 4)])
def test_mean_panels_give_the_exact_mean_of_the_rounds(recorded, title, column):
    expr = _panel(title)
    assert "_bucket" not in expr and "_sum{" not in expr  # histogram sums are approximations
    for (placement, method), rounds in ROUNDS.items():
        exact = sum(r[column] for r in rounds) / len(rounds)
        assert _evaluate(expr, recorded, placement, method) == pytest.approx(exact, abs=1e-12)


def test_known_rounds_read_as_such(recorded):
    tokens, sync = _panel("Tokens per round"), _panel("State sync")
    assert _evaluate(tokens, recorded, "colocated", "ar") == 1.0
    assert _evaluate(sync, recorded, "colocated", "ar") == 0.0
    assert _evaluate(_panel("Rounds/s"), recorded, "split", "fastmtp") == 3


def test_cost_panel_is_mean_draft_plus_sync_over_mean_verify(recorded):
    rounds = ROUNDS[("split", "fastmtp")]
    exact = (sum(r[1] + r[3] for r in rounds) / len(rounds)) / (sum(r[2] for r in rounds) / len(rounds))
    assert _evaluate(_panel("Draft cost"), recorded, "split", "fastmtp") == pytest.approx(exact)
    assert _evaluate(_panel("Draft cost"), recorded, "colocated", "ar") == 0.0


def test_feature_panels_give_bytes_per_round_and_per_token(recorded):
    dash = json.loads(DASHBOARD.read_text())
    (panel,) = [p for p in dash["panels"] if p["title"].startswith("Verifier features sent")]
    per_round, per_token = (t["expr"] for t in panel["targets"])
    for (placement, method), rounds in ROUNDS.items():
        tokens = [r[0] for r in rounds]
        want = _feature_bytes(method, PROMPT + sum(tokens[:-1]))
        assert _evaluate(per_round, recorded, placement, method) == pytest.approx(want / len(rounds))
        assert _evaluate(per_token, recorded, placement, method) == pytest.approx(want / sum(tokens))
    assert recorded[("ray_peftbd_round_feature_bytes_total", "split", "peftbd_head")] \
        == (PROMPT + 1) * ROW
    assert not any(name.endswith("feature_bytes_total") and method != "peftbd_head"
                   for name, _, method in recorded)  # other methods: no series (read as 0)
