"""Acceptance per draft position, and the gamma^j assumption behind the linear-prefix loss.

The loss weighs block position j (1-based) by gamma^(j-1) (`peftbd.prefix_gamma`): it assumes a
constant per-token acceptance gamma, so position j is accepted with probability gamma^j and its
conditional acceptance P(accept j | accepted j - 1) is gamma at every j. The tables set the
measured rates beside gamma^j and beside the fitted gamma's own powers.
"""

from __future__ import annotations

from typing import Any

from peftbd.analysis.tables import fmt, markdown_table
from peftbd.benchmarking.schema import Arm, PerPosition, Results
from peftbd.methods.peft_bd import ID as PEFTBD


def prefix_gamma(results: Results) -> float:
    """The gamma the PEFT-BD adapters were trained with (`peftbd.prefix_gamma`)."""
    return results.config[PEFTBD]["prefix_gamma"]


def fitted_gamma(per_position: PerPosition) -> float | None:
    """The constant per-token acceptance that best explains the rounds: accepted draft tokens /
    positions reached (maximum likelihood under rate_j = gamma^j); None if nothing was reached."""
    reached = sum(per_position.reached)
    return sum(per_position.accepted) / reached if reached else None


def _positioned(results: Results, method: str | None = None) -> list[Arm]:
    """Speculative arms (of `method`, if given) with per-position counts, in report order."""
    return [arm for _, arm in results.arm_items()
            if arm.speculative and arm.per_position.proposed
            and (method is None or arm.method == method)]


def _columns(arms: list[Arm]) -> range:
    return range(1, max(len(arm.per_position.proposed) for arm in arms) + 1)


def _padded(cells: list[Any], n: int) -> list[Any]:
    return cells + [""] * (n - len(cells))


def position_table(results: Results) -> str:
    """Per speculative arm, draft positions 1..D: rate (accepted / proposed rounds)."""
    arms = _positioned(results)
    if not arms:
        return "_No speculative arm has per-position counts._"
    cols = _columns(arms)
    rows = []
    for arm in arms:
        pos = arm.per_position
        cells = [f"{r:.2f} ({a}/{p})" for r, a, p in zip(pos.rate, pos.accepted, pos.proposed)]
        rows.append([arm.label, *_padded(cells, len(cols))])
    return markdown_table(["arm", *[f"j={j}" for j in cols]], rows)


def gamma_table(results: Results) -> str:
    """Per PEFT-BD arm, positions 1..D: measured rate, gamma^j at the training gamma, the fitted
    gamma's powers, and the measured conditional acceptance (the gamma model: constant)."""
    arms = _positioned(results, PEFTBD)
    if not arms:
        return "_No PEFT-BD arm has per-position counts._"
    gamma, cols = prefix_gamma(results), _columns(arms)
    rows = []
    for arm in arms:
        pos, fit = arm.per_position, fitted_gamma(arm.per_position)
        depth = range(1, len(pos.rate) + 1)
        rows += [
            [arm.label, "measured P(accepted prefix >= j)",
             *_padded([fmt(r, 3) for r in pos.rate], len(cols))],
            [arm.label, f"gamma^j, training gamma = {gamma:g}",
             *_padded([fmt(gamma ** j, 3) for j in depth], len(cols))],
            [arm.label, f"fitted gamma^j, fitted gamma = {fmt(fit, 3)}",
             *_padded([fmt(None if fit is None else fit ** j, 3) for j in depth], len(cols))],
            [arm.label, "measured P(accept j | accepted j-1) (model: gamma)",
             *_padded([fmt(c, 3) for c in pos.conditional], len(cols))],
        ]
    return markdown_table(["arm", "quantity", *[f"j={j}" for j in cols]], rows)
