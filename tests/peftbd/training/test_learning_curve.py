"""The learning curve a training manifest records (`peftbd.training.learning_curve`,
`peftbd.training.outputs.training_sections`): its points, the budget marks, the per-row values the
marks keep (checkpoint round trip included) and `still_rising`, the paired comparison of the end
with the half-budget point."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from peftbd.intervals import ratio_difference_interval
from peftbd.training.checkpoint import TrainState, load_checkpoint, save_checkpoint
from peftbd.training.deepspeed_config import BatchPlan
from peftbd.training.learning_curve import (
    MIN_GAIN_TOKENS,
    NO,
    ROW_VALUES,
    TRAIN_TOKENS_COUNTED,
    UNDECIDED,
    YES,
    Z80,
    Z95,
    CurvePoint,
    mark_steps,
    still_rising,
    with_point,
)
from peftbd.training.outputs import training_sections

Rows = list[tuple[int, int]]


def _point(step: int, rows: Rows, max_steps: int = 100) -> dict:
    """The manifest dict of a point at `step` whose val rows are `rows` (accepted, rounds)."""
    mean = sum(a for a, _ in rows) / sum(r for _, r in rows) if rows else None
    return CurvePoint(step, step / max_steps if max_steps else 1.0, 1000 * step, mean, None,
                      tuple(rows)).to_dict()


def _curve(half: Rows, end: Rows) -> list[dict]:
    return [_point(25, half), _point(50, half), _point(75, []), _point(100, end)]


def _draws(seed: int, n: int, p: float, rounds: int = 10) -> Rows:
    """`n` rows of `rounds` rounds each, each round accepting Binomial(4, p) draft tokens."""
    rng = np.random.default_rng(seed)
    return [(int(rng.binomial(4, p, rounds).sum()), rounds) for _ in range(n)]


def test_budget_marks():
    assert mark_steps(100) == {"1/4": 25, "1/2": 50, "all": 100}
    assert mark_steps(7) == {"1/4": 1, "1/2": 3, "all": 7}
    assert mark_steps(2) == {"1/2": 1, "all": 2}
    assert mark_steps(0) == {"all": 0}


def test_a_clearly_rising_paired_sample_is_still_rising():
    half = _draws(0, 60, 0.3)
    end = [(a + 4, r) for a, r in _draws(1, 60, 0.35)]  # every row gains, some more
    rising = still_rising(_curve(half, end), 100)
    assert rising is not None and rising.verdict == YES
    gain = sum(a for a, _ in end) / sum(r for _, r in end) - sum(a for a, _ in half) / sum(
        r for _, r in half)
    assert rising.gain == pytest.approx(gain) and rising.rows == 60
    lo, hi = rising.ci95
    assert 0 < lo < gain < hi
    assert rising.detectable_gain == pytest.approx((Z95 + Z80) * (hi - lo) / 2 / Z95)
    assert rising.detectable_gain == pytest.approx(2.80 / 1.96 * (hi - lo) / 2, rel=1e-3)


def test_a_flat_sample_of_many_rows_is_not_rising():
    half = _draws(2, 2000, 0.3)
    noise = np.random.default_rng(3).integers(-1, 2, len(half))  # -1, 0 or +1 per row, mean 0
    end = [(max(a + int(d), 0), r) for (a, r), d in zip(half, noise)]
    rising = still_rising(_curve(half, end), 100)
    assert rising is not None and rising.verdict == NO
    base = sum(a for a, _ in half) / sum(r for _, r in half)
    assert rising.min_gain == pytest.approx(max(0.05 * base, MIN_GAIN_TOKENS))
    assert rising.ci95[1] < rising.min_gain and rising.ci95[0] < 0.0 < rising.ci95[1]
    assert rising.detectable_gain < rising.min_gain  # this many rows would find a relevant gain
    # a drop is "no" too
    fell = still_rising(_curve(half, [(max(a - 3, 0), r) for a, r in half]), 100)
    assert fell is not None and fell.verdict == NO and fell.ci95[1] < 0


def test_a_noisy_small_sample_is_undecided_not_no():
    half = [(0, 10), (5, 10), (1, 10), (8, 10), (2, 10), (3, 10)]
    end = [(3, 10), (2, 10), (4, 10), (6, 10), (1, 10), (7, 10)]
    rising = still_rising(_curve(half, end), 100)
    assert rising is not None and rising.verdict == UNDECIDED
    assert rising.gain == pytest.approx(23 / 60 - 19 / 60)
    lo, hi = rising.ci95
    assert lo < 0 < rising.min_gain < hi
    assert rising.detectable_gain > rising.gain  # too few rows to detect a gain this size
    ci = ratio_difference_interval([3, 2, 4, 6, 1, 7], [10] * 6, [0, 5, 1, 8, 2, 3], [10] * 6)
    assert rising.ci95 == pytest.approx(ci)


def test_rows_without_a_round_drop_out_and_the_unmeasurable_curves_have_no_verdict():
    half, end = _draws(4, 40, 0.3), _draws(5, 40, 0.3)
    with_empty = still_rising(_curve([*half, (0, 0)], [*end, (0, 0)]), 100)
    assert with_empty == still_rising(_curve(half, end), 100)
    assert with_empty is not None and with_empty.rows == 40
    assert still_rising(_curve(half, end[:-1]), 100) is None  # not the same rows
    assert still_rising(_curve([], end), 100) is None  # an older run's point: no rows
    assert still_rising([_point(100, end)], 100) is None  # no half point
    assert still_rising([_point(0, end, max_steps=0)], 0) is None  # nothing trained
    assert still_rising([_point(1, end, 1)], 1) is None  # the half rounds to step 0


def test_a_point_of_an_eval_keeps_its_rows_at_the_budget_marks():
    metrics = {"eval_accepted_prefix_mean": 1.25, "eval_accepted_prefix_ci95": [1.0, 1.5],
               ROW_VALUES: [[3, 2], [2, 2]]}
    point = CurvePoint.of(3, 12, 4096, metrics)  # a quarter of 12
    assert point == CurvePoint(3, 0.25, 4096, 1.25, (1.0, 1.5), ((3, 2), (2, 2)))
    assert CurvePoint.from_dict(point.to_dict()) == point
    assert point.to_dict() == {"step": 3, "fraction": 0.25, "train_tokens": 4096,
                               "accepted_prefix_mean": 1.25, "ci95": [1.0, 1.5],
                               "rows": [[3, 2], [2, 2]]}
    assert CurvePoint.of(4, 12, 4096, metrics).rows == ()  # no mark: no rows kept
    assert CurvePoint.of(0, 0, 0, {}) == CurvePoint(0, 1.0, 0, None, None)  # no steps: all of it
    assert CurvePoint.from_dict({k: v for k, v in point.to_dict().items() if k != "rows"}).rows == ()
    again = CurvePoint(3, 0.25, 4096, 1.3, None)
    assert with_point((CurvePoint.of(1, 12, 10, {}), point), again) == (
        CurvePoint.of(1, 12, 10, {}), again)


class _Engine:
    """What the checkpoint functions use of a DeepSpeed engine: the client state goes through
    `torch.save` / `torch.load` as DeepSpeed's does."""

    def __init__(self) -> None:
        self.module = torch.nn.Linear(1, 1)

    def save_checkpoint(self, ckpt_dir: str, tag: str, client_state: dict, **_: object) -> None:
        torch.save(client_state, f"{ckpt_dir}/{tag}.pt")

    def load_checkpoint(self, ckpt_dir: str, tag: str, **_: object) -> tuple[None, dict]:
        return None, torch.load(f"{ckpt_dir}/{tag}.pt", weights_only=True)


def test_the_per_row_values_survive_a_checkpoint_round_trip(tmp_path):
    rows = tuple((a, r) for a, r in _draws(6, 16, 0.4))
    curve = (CurvePoint(50, 0.5, 5000, 0.4, (0.3, 0.5), rows),
             CurvePoint(60, 0.6, 6000, 0.45, (0.35, 0.55)))
    state = TrainState(step=60, train_tokens=6000, curve=curve)
    engine = _Engine()
    save_checkpoint(engine, tmp_path, state, "fp")
    assert load_checkpoint(engine, tmp_path, "fp") == state


def test_the_manifest_gets_the_curve_and_the_verdict_without_the_rows_in_metrics():
    half = _draws(7, 60, 0.3)
    end = [(a + 4, r) for a, r in half]
    curve = [_point(25, half), _point(50, half), _point(100, end)]
    final = {"parameters": {}, "workers": {}, "step": 100, "steps_run": 100,
             "steps_per_second": 1.0, "train_seconds": 100.0, "memory_estimate": {},
             "eval_loss": 2.0, "eval_accepted_prefix_mean": 1.5,
             "eval_accepted_prefix_ci95": [1.4, 1.6], ROW_VALUES: curve[-1]["rows"],
             "learning_curve": curve, "train_tokens": 100_000, "max_steps": 100}
    plan = BatchPlan(global_batch=8, micro_batch=4, accumulation=1, world_size=2)
    sections = training_sections("head", final, plan, train_rows=800)
    assert sections["learning_curve"] == curve
    rising = still_rising(curve, 100)
    assert sections["still_rising"] == YES == rising.verdict
    assert sections["rising"] == rising.to_dict()
    assert sections["rising"]["rows"] == 60 and sections["rising"]["gain"] == pytest.approx(0.4)
    assert set(sections["rising"]) == {"gain", "ci95", "detectable_gain", "min_gain", "rows"}
    assert ROW_VALUES not in sections["metrics"]
    assert sections["metrics"]["eval_accepted_prefix_ci95"] == [1.4, 1.6]
    assert sections["training"]["max_steps"] == 100
    assert sections["training"]["train_tokens"] == 100_000
    assert sections["training"]["train_tokens_counted"] == TRAIN_TOKENS_COUNTED
    short = training_sections("head", {**final, "learning_curve": curve[-1:]}, plan, 800)
    assert short["still_rising"] is None and short["rising"] is None
