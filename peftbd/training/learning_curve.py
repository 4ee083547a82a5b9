"""A training run's learning curve: the offline accepted prefix (with its 95% interval) at every
evaluation, against the steps and the tokens trained on so far, and whether it was still rising.

The schedule (`peftbd.training.schedule`) evaluates at every `eval_every` steps, at the marks
`max_steps // 4` and `max_steps // 2` and at the last step; each evaluation adds a `CurvePoint`
to the run's `TrainState`, so a resumed run keeps the points of the run it resumed (they travel in
the checkpoint). A point at a budget mark also keeps each evaluated val row's (accepted draft
tokens, rounds), in the val split's order: every evaluation of a run scores the same rows in the
same order, so two marks compare row by row. The training manifest gets the points
(`learning_curve`), `still_rising` and its detail `rising` (below).

Still rising: the gain of the accepted prefix from the half-budget point to the end, paired on
the same val rows, with its 95% interval (`peftbd.intervals.ratio_difference_interval`): "yes"
when the interval lies above 0, "no" when it lies below the smallest relevant gain (`min_gain`),
"undecided" otherwise (the comparison cannot tell). Its power: `detectable_gain`, the smallest gain
it detects with 80% power at the 5% level, (z_0.975 + z_0.8) x the standard error of the paired
difference (the interval's half-width / z_0.975); a smaller real gain may read "undecided".

`train_tokens` counts sequence tokens: prompt + continuation of every train row a step read,
padding excluded, summed over the Ray Train workers (`TRAIN_TOKENS_COUNTED`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

from peftbd.intervals import ratio_difference_interval

TRAIN_TOKENS_COUNTED = ("sequence tokens (prompt + continuation, padding excluded) of the train "
                        "rows read up to the step, summed over the workers")
"""What a curve point's `train_tokens` counts (the manifest says it beside the curve)."""

ROW_VALUES = "eval_row_values"
"""The eval metrics' key of each evaluated val row's [accepted draft tokens, rounds], in the val
split's order (`peftbd.training.evaluate`); a curve point at a budget mark keeps them."""

MIN_GAIN_SHARE, MIN_GAIN_TOKENS = 0.05, 0.05
"""The smallest gain worth more training: 5% of the half-budget accepted prefix, and at least
0.05 tokens per round (`min_gain`)."""

Z95, Z80 = NormalDist().inv_cdf(0.975), NormalDist().inv_cdf(0.8)
"""The standard normal quantiles of a two-sided 5% test and of 80% power."""

YES, NO, UNDECIDED = "yes", "no", "undecided"
"""`still_rising`'s verdicts."""


def mark_steps(max_steps: int) -> dict[str, int]:
    """The steps of the budget marks a run always evaluates at: {"1/4": ..., "1/2": ..., "all":
    max_steps} (a quarter or a half that rounds down to step 0 is left out: nothing trained)."""
    marks = {"1/4": max_steps // 4, "1/2": max_steps // 2}
    return {**{k: s for k, s in marks.items() if s > 0}, "all": max_steps}


@dataclass(frozen=True)
class CurvePoint:
    """One evaluation: its step, the fraction of the step budget done, the tokens trained on so
    far, the offline accepted prefix (accepted draft tokens per round, bonus excluded), its 95%
    interval [lo, hi] (None: not measured, or too few val rows for an interval) and, at a budget
    mark, each evaluated val row's (accepted draft tokens, rounds) in the val split's order
    (empty elsewhere, or when the task gives none)."""

    step: int
    fraction: float
    train_tokens: int
    accepted_prefix_mean: float | None
    ci95: tuple[float, float] | None
    rows: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, step: int, max_steps: int, train_tokens: int, metrics: dict[str, Any]) -> CurvePoint:
        """The point of an evaluation's `metrics` (`peftbd.training.evaluate.evaluate`'s) at
        `step`; a run without steps (max_steps 0) is at its whole budget."""
        mean, ci = metrics.get("eval_accepted_prefix_mean"), metrics.get("eval_accepted_prefix_ci95")
        at_mark = step in mark_steps(max_steps).values()
        return cls(step, step / max_steps if max_steps else 1.0, int(train_tokens),
                   None if mean is None else float(mean),
                   None if ci is None else (float(ci[0]), float(ci[1])),
                   _rows(metrics.get(ROW_VALUES) if at_mark else None))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CurvePoint:
        ci = d.get("ci95")
        return cls(int(d["step"]), float(d["fraction"]), int(d["train_tokens"]),
                   d.get("accepted_prefix_mean"),
                   None if ci is None else (float(ci[0]), float(ci[1])), _rows(d.get("rows")))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci95"] = None if self.ci95 is None else list(self.ci95)
        d["rows"] = [list(r) for r in self.rows]
        return d


def _rows(values: Sequence[Sequence[int]] | None) -> tuple[tuple[int, int], ...]:
    return tuple((int(a), int(r)) for a, r in values or ())


def with_point(curve: Sequence[CurvePoint], point: CurvePoint) -> tuple[CurvePoint, ...]:
    """`curve` with `point` last (an earlier point of the same step replaced: a run resumed at
    its last step evaluates it again)."""
    return (*(p for p in curve if p.step != point.step), point)


def at_step(curve: Sequence[dict[str, Any]], step: int) -> dict[str, Any] | None:
    """The point of `curve` (the manifest's dicts) at `step`, or None."""
    return next((p for p in curve if p["step"] == step), None)


@dataclass(frozen=True)
class Rising:
    """The paired comparison of the end with the half-budget point (see module doc): the verdict,
    the gain end - half of the accepted prefix over the `rows` val rows with a round, its 95%
    interval and detectable gain (None: too few rows for an interval) and `min_gain`."""

    verdict: str
    gain: float
    ci95: tuple[float, float] | None
    detectable_gain: float | None
    min_gain: float
    rows: int

    def to_dict(self) -> dict[str, Any]:
        """The manifest's `rising` block (the verdict is `still_rising` beside it)."""
        return {"gain": self.gain, "ci95": None if self.ci95 is None else list(self.ci95),
                "detectable_gain": self.detectable_gain, "min_gain": self.min_gain,
                "rows": self.rows}


def still_rising(curve: Sequence[dict[str, Any]], max_steps: int) -> Rising | None:
    """Whether the accepted prefix still rose from the half-budget point to the end (see module
    doc); None when the curve lacks either point, they coincide (max_steps < 2), either has no
    per-row values (a point of an older run) or they hold different rows, or no row has a
    round."""
    marks = mark_steps(max_steps)
    half = at_step(curve, marks["1/2"]) if "1/2" in marks else None
    end = at_step(curve, max_steps)
    if half is None or end is None or half["step"] == end["step"]:
        return None
    before, after = _rows(half.get("rows")), _rows(end.get("rows"))
    if not before or len(before) != len(after):
        return None
    pairs = [(b, a) for b, a in zip(before, after) if b[1] > 0 and a[1] > 0]
    if not pairs:
        return None
    num_b, den_b = [b[0] for b, _ in pairs], [b[1] for b, _ in pairs]
    num_a, den_a = [a[0] for _, a in pairs], [a[1] for _, a in pairs]
    base = sum(num_b) / sum(den_b)
    gain = sum(num_a) / sum(den_a) - base
    min_gain = max(MIN_GAIN_SHARE * base, MIN_GAIN_TOKENS)
    ci = ratio_difference_interval(num_a, den_a, num_b, den_b)
    if ci is None:
        return Rising(UNDECIDED, gain, None, None, min_gain, len(pairs))
    lo, hi = float(ci[0]), float(ci[1])
    verdict = YES if lo > 0 else NO if hi < min_gain else UNDECIDED
    return Rising(verdict, gain, (lo, hi), (Z95 + Z80) * (hi - lo) / 2 / Z95, min_gain, len(pairs))
