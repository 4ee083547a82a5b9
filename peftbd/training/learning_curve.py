"""A training run's learning curve: the offline accepted prefix (with its 95% interval) at every
evaluation, against the steps and the tokens trained on so far.

The schedule (`peftbd.training.schedule`) evaluates at every `eval_every` steps, at the marks
`max_steps // 4` and `max_steps // 2` and at the last step; each evaluation adds a `CurvePoint`
to the run's `TrainState`, so a resumed run keeps the points of the run it resumed (they travel in
the checkpoint). The training manifest gets the points (`learning_curve`) and `still_rising`.

`train_tokens` counts sequence tokens: prompt + continuation of every train row a step read,
padding excluded, summed over the Ray Train workers (`TRAIN_TOKENS_COUNTED`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

TRAIN_TOKENS_COUNTED = ("sequence tokens (prompt + continuation, padding excluded) of the train "
                        "rows read up to the step, summed over the workers")
"""What a curve point's `train_tokens` counts (the manifest says it beside the curve)."""


def mark_steps(max_steps: int) -> dict[str, int]:
    """The steps of the budget marks a run always evaluates at: {"1/4": ..., "1/2": ..., "all":
    max_steps} (a quarter or a half that rounds down to step 0 is left out: nothing trained)."""
    marks = {"1/4": max_steps // 4, "1/2": max_steps // 2}
    return {**{k: s for k, s in marks.items() if s > 0}, "all": max_steps}


@dataclass(frozen=True)
class CurvePoint:
    """One evaluation: its step, the fraction of the step budget done, the tokens trained on so
    far, the offline accepted prefix (accepted draft tokens per round, bonus excluded) and its
    95% interval [lo, hi] (None: not measured, or too few val rows for an interval)."""

    step: int
    fraction: float
    train_tokens: int
    accepted_prefix_mean: float | None
    ci95: tuple[float, float] | None

    @classmethod
    def of(cls, step: int, max_steps: int, train_tokens: int, metrics: dict[str, Any]) -> CurvePoint:
        """The point of an evaluation's `metrics` (a task's `eval_metrics`) at `step`; a run
        without steps (max_steps 0) is at its whole budget."""
        mean, ci = metrics.get("eval_accepted_prefix_mean"), metrics.get("eval_accepted_prefix_ci95")
        return cls(step, step / max_steps if max_steps else 1.0, int(train_tokens),
                   None if mean is None else float(mean),
                   None if ci is None else (float(ci[0]), float(ci[1])))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CurvePoint:
        ci = d.get("ci95")
        return cls(int(d["step"]), float(d["fraction"]), int(d["train_tokens"]),
                   d.get("accepted_prefix_mean"),
                   None if ci is None else (float(ci[0]), float(ci[1])))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci95"] = None if self.ci95 is None else list(self.ci95)
        return d


def with_point(curve: Sequence[CurvePoint], point: CurvePoint) -> tuple[CurvePoint, ...]:
    """`curve` with `point` last (an earlier point of the same step replaced: a run resumed at
    its last step evaluates it again)."""
    return (*(p for p in curve if p.step != point.step), point)


def half_width(ci95: Sequence[float] | None) -> float | None:
    """Half the width of an interval [lo, hi] (None: no interval)."""
    return None if ci95 is None else (float(ci95[1]) - float(ci95[0])) / 2


def at_step(curve: Sequence[dict[str, Any]], step: int) -> dict[str, Any] | None:
    """The point of `curve` (the manifest's dicts) at `step`, or None."""
    return next((p for p in curve if p["step"] == step), None)


def still_rising(curve: Sequence[dict[str, Any]], max_steps: int) -> bool | None:
    """True when the accepted prefix gained more from the half-budget point to the final point
    than the final point's interval half-width (more training would likely still help); None
    when the curve lacks either point, they coincide (max_steps < 2) or the final point has no
    interval."""
    marks = mark_steps(max_steps)
    half = at_step(curve, marks["1/2"]) if "1/2" in marks else None
    final = at_step(curve, max_steps)
    if half is None or final is None or half["step"] == final["step"]:
        return None
    h = half_width(final.get("ci95"))
    if h is None or half.get("accepted_prefix_mean") is None or final.get("accepted_prefix_mean") is None:
        return None
    return float(final["accepted_prefix_mean"]) - float(half["accepted_prefix_mean"]) > h
