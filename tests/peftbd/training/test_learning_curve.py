"""The learning curve a training manifest records (`peftbd.training.learning_curve`,
`peftbd.training.outputs.training_sections`): its points, the budget marks and `still_rising`."""

from __future__ import annotations

from peftbd.training.deepspeed_config import BatchPlan
from peftbd.training.learning_curve import (
    TRAIN_TOKENS_COUNTED,
    CurvePoint,
    mark_steps,
    still_rising,
    with_point,
)
from peftbd.training.outputs import training_sections


def _point(step: int, mean: float | None, half: float | None, max_steps: int = 100) -> dict:
    ci = None if half is None or mean is None else [mean - half, mean + half]
    return CurvePoint(step, step / max_steps if max_steps else 1.0, 1000 * step, mean,
                      None if ci is None else (ci[0], ci[1])).to_dict()


def test_budget_marks():
    assert mark_steps(100) == {"1/4": 25, "1/2": 50, "all": 100}
    assert mark_steps(7) == {"1/4": 1, "1/2": 3, "all": 7}
    assert mark_steps(2) == {"1/2": 1, "all": 2}
    assert mark_steps(0) == {"all": 0}


def test_still_rising_when_the_last_half_gains_more_than_the_final_interval():
    def curve(half_mean: float, final_mean: float, final_half: float | None) -> list[dict]:
        return [_point(25, 0.5, 0.1), _point(50, half_mean, 0.1), _point(75, 0.9, 0.1),
                _point(100, final_mean, final_half)]

    assert still_rising(curve(1.0, 1.3, 0.2), 100) is True  # gained 0.3 > 0.2
    assert still_rising(curve(1.0, 1.1, 0.2), 100) is False  # gained 0.1, within the interval
    assert still_rising(curve(1.0, 0.7, 0.2), 100) is False  # fell
    assert still_rising(curve(1.0, 1.3, None), 100) is None  # no final interval
    assert still_rising([_point(100, 1.3, 0.2)], 100) is None  # no half point
    assert still_rising([_point(0, 1.3, 0.2, max_steps=0)], 0) is None  # nothing trained
    assert still_rising([_point(1, 0.2, 0.1, 1)], 1) is None  # the half rounds to step 0


def test_a_point_of_an_eval_and_a_repeated_step_replaced():
    metrics = {"eval_accepted_prefix_mean": 1.25, "eval_accepted_prefix_ci95": [1.0, 1.5]}
    point = CurvePoint.of(3, 12, 4096, metrics)
    assert point == CurvePoint(3, 0.25, 4096, 1.25, (1.0, 1.5))
    assert CurvePoint.from_dict(point.to_dict()) == point
    assert point.to_dict() == {"step": 3, "fraction": 0.25, "train_tokens": 4096,
                               "accepted_prefix_mean": 1.25, "ci95": [1.0, 1.5]}
    assert CurvePoint.of(0, 0, 0, {}) == CurvePoint(0, 1.0, 0, None, None)  # no steps: all of it
    again = CurvePoint(3, 0.25, 4096, 1.3, None)
    assert with_point((CurvePoint.of(1, 12, 10, {}), point), again) == (
        CurvePoint.of(1, 12, 10, {}), again)


def test_the_manifest_gets_the_curve_and_still_rising():
    curve = [_point(25, 0.5, 0.1), _point(50, 1.0, 0.1), _point(100, 1.5, 0.1)]
    final = {"parameters": {}, "workers": {}, "step": 100, "steps_run": 100,
             "steps_per_second": 1.0, "train_seconds": 100.0, "memory_estimate": {},
             "eval_loss": 2.0, "eval_accepted_prefix_mean": 1.5,
             "eval_accepted_prefix_ci95": [1.4, 1.6], "learning_curve": curve,
             "train_tokens": 100_000, "max_steps": 100}
    plan = BatchPlan(global_batch=8, micro_batch=4, accumulation=1, world_size=2)
    sections = training_sections("head", final, plan, train_rows=800)
    assert sections["learning_curve"] == curve
    assert sections["still_rising"] is True
    assert sections["metrics"]["eval_accepted_prefix_ci95"] == [1.4, 1.6]
    assert sections["training"]["max_steps"] == 100
    assert sections["training"]["train_tokens"] == 100_000
    assert sections["training"]["train_tokens_counted"] == TRAIN_TOKENS_COUNTED
