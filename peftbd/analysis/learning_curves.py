"""The report's "Learning curves" section: each trained drafter's offline accepted prefix (with its
95% interval) at a quarter, a half and all of its step budget, the tokens it trained on and whether
it was still rising, read from the training manifests (`learning_curve`, `still_rising`: see
`peftbd.training.learning_curve` and `peftbd.training.outputs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peftbd.analysis.tables import markdown_table
from peftbd.training.learning_curve import at_step, mark_steps

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


def _flag(value: bool | None) -> str:
    return "n/a" if value is None else ("**yes**" if value else "no")


def _tokens(value: Any) -> str:
    return "n/a" if value is None else f"{int(value):,}"


def curve_rows(manifests: Mapping[str, dict[str, Any]]) -> list[list[str]]:
    """One row per training manifest: drafter, the accepted prefix at 1/4, 1/2 and all of the
    budget (n/a where the curve has no such point), train tokens at the end, still rising."""
    rows = []
    for title, m in training_manifests(manifests).items():
        training, curve = m["training"], m.get("learning_curve") or []
        max_steps = int(training.get("max_steps", training.get("steps", 0)) or 0)
        marks = mark_steps(max_steps)
        cells = [_point_cell(at_step(curve, marks[k]) if k in marks else None)
                 for k in ("1/4", "1/2", "all")]
        end = at_step(curve, max_steps)
        tokens = end.get("train_tokens") if end else training.get("train_tokens")
        rows.append([title, *cells, _tokens(tokens), _flag(m.get("still_rising"))])
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
        "over the val rows [brackets] (delta method for the ratio accepted / rounds, rows "
        f"independent). Train tokens: {counted}. Still rising: the gain from the half-budget "
        "point to the end exceeds the end's interval half-width, so a longer budget would likely "
        "draft better (n/a: no separate half point or no interval).",
        markdown_table(["drafter", "1/4 budget", "1/2 budget", "all of it", "train tokens (end)",
                        "still rising"], rows),
    ]
