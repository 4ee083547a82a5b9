"""The manifest sections of a finished training run, from the metrics its workers reported."""

from __future__ import annotations

from typing import Any

from peftbd.training.deepspeed_config import BatchPlan
from peftbd.training.learning_curve import ROW_VALUES, TRAIN_TOKENS_COUNTED, still_rising


def training_sections(kind: str, final: dict[str, Any], plan: BatchPlan, train_rows: int) -> dict[str, Any]:
    """`stage`, `parameters`, `metrics` (the eval_* values), `workers` (the workers' measured
    peaks, the largest over the ranks, and the dtype that trained), `training` (steps,
    throughput, batch layout, tokens trained on, the estimated peak of one step),
    `learning_curve` (every eval's point: step, fraction of the step budget, train tokens so
    far, accepted prefix and its 95% interval, the val rows' values at the budget marks;
    `peftbd.training.learning_curve`), `still_rising` ("yes", "no" or "undecided" from the end
    paired with the half-budget point on the same val rows; None: not measurable) and `rising`
    (its gain, 95% interval, detectable gain, minimum relevant gain and rows) of a run whose last
    report was `final`. The per-row values stay out of `metrics` (the curve's last point has
    them)."""
    curve = final.get("learning_curve", [])
    max_steps = final.get("max_steps", final["step"])
    rising = still_rising(curve, max_steps)
    return {
        "stage": f"train_{kind}",
        "parameters": final["parameters"],
        "workers": final["workers"],
        "metrics": {k: v for k, v in final.items() if k.startswith("eval_") and k != ROW_VALUES},
        "training": {
            "steps": final["step"],
            "steps_run_last_attempt": final["steps_run"],
            "steps_per_second": final["steps_per_second"],
            "train_seconds": final["train_seconds"],
            "final_train_loss": final.get("train_loss"),
            "global_batch": plan.global_batch,
            "micro_batch": plan.micro_batch,
            "accumulation": plan.accumulation,
            "workers": plan.world_size,
            # None: not one global batch of train rows (a run published untrained, max_steps 0)
            "steps_per_epoch": (plan.steps_per_epoch(train_rows)
                                if train_rows // plan.global_batch else None),
            "memory_estimate": final["memory_estimate"],
            "max_steps": max_steps,
            "train_tokens": final.get("train_tokens"),
            "train_tokens_counted": TRAIN_TOKENS_COUNTED,
        },
        "learning_curve": curve,
        "still_rising": None if rising is None else rising.verdict,
        "rising": None if rising is None else rising.to_dict(),
    }
