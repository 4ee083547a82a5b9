"""The report's learning curves (`peftbd.analysis.learning_curves`) from hand-built training
manifests, and the DFlash recipe ablation's noise verdicts (`peftbd.analysis.recipe_ablation`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from peftbd.analysis import learning_curves
from peftbd.analysis.recipe_ablation import (
    RESOLVED,
    WITHIN_NOISE,
    AblationRow,
    ablation_markdown,
    ablation_rows,
    ablation_section,
)
from peftbd.analysis.report import build_report


def _point(step: int, max_steps: int, mean: float, half: float | None) -> dict:
    return {"step": step, "fraction": step / max_steps, "train_tokens": 512 * step,
            "accepted_prefix_mean": mean,
            "ci95": None if half is None else [mean - half, mean + half]}


def _training(stage: str, max_steps: int, means: dict[int, float], half: float | None,
              still_rising: str | bool | None, rising: dict | None = None) -> dict:
    curve = [_point(s, max_steps, m, half) for s, m in sorted(means.items())]
    return {"stage": stage, "wall_seconds": 10.0,
            "metrics": {"eval_accepted_prefix_mean": curve[-1]["accepted_prefix_mean"],
                        "eval_accepted_prefix_ci95": curve[-1]["ci95"]},
            "training": {"steps": max_steps, "max_steps": max_steps,
                         "train_tokens": 512 * max_steps,
                         "train_tokens_counted": "sequence tokens (test)"},
            "learning_curve": curve, "still_rising": still_rising, "rising": rising}


def _rising(gain: float, ci: list[float] | None, detectable: float | None) -> dict:
    return {"gain": gain, "ci95": ci, "detectable_gain": detectable, "min_gain": 0.06, "rows": 16}


MANIFESTS = {
    "generate continuations": {"stage": "generate", "wall_seconds": 5.0},
    "train PEFT-BD adapter": _training("train_peftbd", 200, {50: 0.8, 100: 1.2, 150: 1.4, 200: 1.9},
                                       0.1, "yes", _rising(0.7, [0.5, 0.9], 0.28)),
    "train FastMTP head": _training("train_mtp", 40, {10: 0.3, 20: 0.61, 40: 0.64}, 0.05,
                                    "undecided", _rising(0.03, [-0.05, 0.11], 0.11)),
    "train PEFT-BD head": _training("train_head", 40, {10: 0.3, 20: 0.61, 40: 0.62}, 0.05, "no",
                                    _rising(0.01, [-0.01, 0.03], 0.03)),
    # a manifest from before the paired comparison: a bool verdict, no detail
    "train early-exit PEFT-BD": _training("train_peftbd_early", 40, {20: 0.5, 40: 0.9}, 0.05, True),
    # an old manifest: no curve
    "train DFlash head": {"stage": "train_dflash", "training": {"steps": 8}, "metrics": {}},
}


def test_the_table_has_each_drafters_quarter_half_and_end_with_intervals():
    text = "\n\n".join(learning_curves.section(MANIFESTS))
    assert text.startswith(learning_curves.TITLE)
    assert "sequence tokens (test)" in text
    lines = text.splitlines()
    assert ("| train PEFT-BD adapter | 0.80 [0.70, 0.90] (step 50) | 1.20 [1.10, 1.30] "
            "(step 100) | 1.90 [1.80, 2.00] (step 200) | 102,400 | "
            "**yes**: +0.70 [+0.50, +0.90]; detects 0.28 |") in lines
    assert ("| train FastMTP head | 0.30 [0.25, 0.35] (step 10) | 0.61 [0.56, 0.66] "
            "(step 20) | 0.64 [0.59, 0.69] (step 40) | 20,480 | "
            "undecided: +0.03 [-0.05, +0.11]; detects 0.11 |") in lines
    assert "| train DFlash head | n/a | n/a | n/a | n/a | n/a |" in lines
    assert not any("generate" in line for line in lines if line.startswith("|"))


def test_the_still_rising_cell_shows_the_verdict_gain_interval_and_detectable_gain():
    rows = {row[0]: row[-1] for row in learning_curves.curve_rows(MANIFESTS)}
    assert rows["train PEFT-BD head"] == "no: +0.01 [-0.01, +0.03]; detects 0.03"
    assert rows["train early-exit PEFT-BD"] == "n/a"  # the old rule's bool is no verdict
    assert rows["train DFlash head"] == "n/a"
    assert learning_curves.rising_cell("undecided", _rising(0.2, None, None)) == (
        "undecided: +0.20 (no interval)")
    assert learning_curves.rising_cell("yes", None) == "**yes**"
    assert learning_curves.rising_cell(None, None) == "n/a"


def test_no_training_manifest_no_section():
    assert learning_curves.section({"generate continuations": {"stage": "generate"}}) == []
    assert learning_curves.section({}) == []


def test_the_report_shows_the_learning_curves(tmp_path: Path, sample_results):
    text = build_report(sample_results, MANIFESTS, tmp_path).read_text()
    assert learning_curves.TITLE in text
    assert "| train PEFT-BD adapter | 0.80 [0.70, 0.90] (step 50)" in text
    bare = build_report(sample_results, {}, tmp_path / "bare").read_text()
    assert learning_curves.TITLE not in bare


def _run(prefix: float, half: float | None) -> dict:
    return {"metrics": {"eval_accepted_prefix_mean": prefix,
                        "eval_accepted_prefix_ci95": None if half is None else
                        [prefix - half, prefix + half]}}


def test_the_ablation_marks_a_difference_resolved_only_beyond_the_combined_interval():
    full = _run(2.0, 0.3)
    rows = ablation_rows(full, _run(0.5, 0.4), {
        "feature_rule": _run(1.4, 0.4),  # buys 0.6 > sqrt(0.3² + 0.4²) = 0.5
        "block_masks": _run(1.6, 0.4),  # buys 0.4 < 0.5
        "anchors": _run(1.0, None),  # no interval: not judged
    })
    by = {r.reverted or r.variant: r for r in rows}
    assert by["DFlash (all four changes)"].half_width == pytest.approx(0.3)
    assert by["DFlash (all four changes)"].verdict is None
    assert by["feature_rule"].verdict == RESOLVED
    assert (by["feature_rule"].noise, by["feature_rule"].buys) == pytest.approx((0.5, 0.6))
    assert by["block_masks"].verdict == WITHIN_NOISE
    assert by["block_masks"].half_width == pytest.approx(0.4)
    assert by["anchors"].verdict is None and by["anchors"].noise is None
    head = by["today's head (none of them)"]
    assert head.buys == pytest.approx(1.5) and head.verdict == RESOLVED
    table = ablation_markdown(rows)
    assert "| 2.40 ±0.40 | +0.60 (noise ±0.50) | resolved |" in table
    assert "| 2.60 ±0.40 | +0.40 (noise ±0.50) | within noise |" in table
    assert "| 2.00 | +1.00 | n/a (no interval) |" in table
    assert "| DFlash (all four changes) |  | 3.00 ±0.30 | n/a |  |" in table


def test_an_ablation_manifest_without_intervals_still_renders():
    old = {"rows": [{"variant": "DFlash (all four changes)", "reverted": None,
                     "tokens_per_round": 2.5, "buys": None},
                    {"variant": "DFlash without its anchors", "reverted": "anchors",
                     "tokens_per_round": 2.25, "buys": 0.25}]}
    text = "\n".join(ablation_section(old, "recipe_ablation"))
    assert "| 2.25 | +0.25 | n/a (no interval) |" in text
    assert AblationRow(**old["rows"][1]).verdict is None
