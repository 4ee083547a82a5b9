"""The report's "Learning curves" section: each trained drafter's offline accepted prefix (with its
95% interval) at a quarter, a half and all of its step budget, the tokens it trained on and whether
it was still rising (the verdict of the end paired with the half-budget point on the same val rows,
its gain with the 95% interval and the gain it detects), read from the training manifests
(`learning_curve`, `still_rising`, `rising`: see `peftbd.training.learning_curve` and
`peftbd.training.outputs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peftbd.analysis.tables import markdown_table
from peftbd.training.learning_curve import (
    MIN_GAIN_SHARE,
    MIN_GAIN_TOKENS,
    NO,
    UNDECIDED,
    YES,
    at_step,
    mark_steps,
)

TITLE = "## Learning curves: accepted prefix over each drafter's training budget"


def training_manifests(manifests: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{stage title: manifest} of the training stages among `manifests` (report order kept)."""
    return {title: m for title, m in manifests.items()
            if str(m.get("stage", "")).startswith("train_") and isinstance(m.get("training"), dict)}


def _point_cell(point: dict[str, Any] | None) -> str:
    if point is None or point.get("accepted_prefix_mean") is None:
        return "n/a"
    ci = point.get("ci95")
    interval = "" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    return f"{point['accepted_prefix_mean']:.2f}{interval} (step {point['step']})"


def rising_cell(verdict: Any, rising: dict[str, Any] | None) -> str:
    """The "still rising" cell: the verdict, the paired gain end - half [95% interval] and the
    gain the comparison detects; "n/a" for no verdict (not measurable, or a manifest from before
    the paired comparison, whose verdict was a bool)."""
    if verdict not in (YES, NO, UNDECIDED):
        return "n/a"
    shown = f"**{verdict}**" if verdict == YES else verdict
    if not rising:
        return shown
    ci, detectable = rising.get("ci95"), rising.get("detectable_gain")
    interval = " (no interval)" if ci is None else f" [{ci[0]:+.2f}, {ci[1]:+.2f}]"
    detects = "" if detectable is None else f"; detects {detectable:.2f}"
    return f"{shown}: {rising['gain']:+.2f}{interval}{detects}"


def _tokens(value: Any) -> str:
    return "n/a" if value is None else f"{int(value):,}"


def curve_rows(manifests: Mapping[str, dict[str, Any]]) -> list[list[str]]:
    """One row per training manifest: drafter, the accepted prefix at 1/4, 1/2 and all of the
    budget (n/a where the curve has no such point), train tokens at the end, still rising
    (`rising_cell`)."""
    rows = []
    for title, m in training_manifests(manifests).items():
        training, curve = m["training"], m.get("learning_curve") or []
        max_steps = int(training.get("max_steps", training.get("steps", 0)) or 0)
        marks = mark_steps(max_steps)
        cells = [_point_cell(at_step(curve, marks[k]) if k in marks else None)
                 for k in ("1/4", "1/2", "all")]
        end = at_step(curve, max_steps)
        tokens = end.get("train_tokens") if end else training.get("train_tokens")
        rows.append([title, *cells, _tokens(tokens),
                     rising_cell(m.get("still_rising"), m.get("rising"))])
    return rows


def section(manifests: Mapping[str, dict[str, Any]]) -> list[str]:
    """The report's section (nothing when no training manifest is among `manifests`)."""
    rows = curve_rows(manifests)
    if not rows:
        return []
    counted = next((m["training"].get("train_tokens_counted") for m in
                    training_manifests(manifests).values() if m["training"].get("train_tokens_counted")),
                   "sequence tokens of the train rows read, summed over the workers")
    return [
        TITLE,
        "Accepted draft tokens per round (bonus excluded), the engine's rounds replayed on the val "
        "rows at a quarter, a half and all of each drafter's step budget, with the 95% interval "
        "over the val rows [brackets] (the ratio accepted / rounds, rows independent). Train "
        f"tokens: {counted}. Still rising: the gain from the half-budget point to the end, paired "
        "on the same val rows (each row scored at both points), with its 95% interval: **yes** "
        "when the interval lies above 0 (a longer budget would likely draft better), no when it "
        "lies below the smallest gain worth more training (the larger of "
        f"{MIN_GAIN_SHARE:.0%} of the half-budget value and {MIN_GAIN_TOKENS:g} tokens per "
        "round), undecided otherwise. Its power: it detects a gain of at least the \"detects\" "
        "value with 80% probability at the 5% level ((1.96 + 0.84) x the paired standard "
        "error); a smaller real gain may read undecided (n/a: no separate half point or no "
        "per-row values).",
        markdown_table(["drafter", "1/4 budget", "1/2 budget", "all of it", "train tokens (end)",
                        "still rising: gain end - 1/2 [95%]"], rows),
    ]
