"""The report's concurrency section from synthetic rows: Table 8, Figure 3, each speculative
arm's crossing of 1.0 and the engine goal, all from the numbers."""

from __future__ import annotations

import dataclasses

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pytest

from peftbd.analysis.concurrency import (
    NO_SWEEP,
    concurrency_table,
    crossover,
    crossovers,
    engine_goal,
    engine_goal_sentence,
    short_passes_note,
)
from peftbd.analysis.figures import throughput_vs_batch
from peftbd.analysis.report import FIGURE_3, build_report
from peftbd.benchmarking.schema import ConcurrencyRow, Results

AR = {1: 100.0, 4: 380.0, 16: 900.0}


def _with_sweep(results: Results, tps: dict[str, dict[int, float]],
                inexact: tuple = ()) -> Results:
    """`results` with concurrency rows of tok/s `tps[arm][B]` (speedup over `tps['ar']`);
    (arm, B) in `inexact` are not exact."""
    rows = [ConcurrencyRow(arm, b, t, 2.0, (arm, b) not in inexact, t / tps["ar"][b], 4.0)
            for arm, by_b in tps.items() for b, t in by_b.items()]
    return results.model_copy(update={"concurrency": rows})


@pytest.fixture
def swept(sample_results) -> Results:
    """AR scaling 9x to batch 16; PEFT-BD falling below AR between 4 and 16; FastMTP above."""
    return _with_sweep(sample_results, {
        "ar": AR, "peftbd": {1: 150.0, 4: 400.0, 16: 720.0},
        "fastmtp": {1: 130.0, 4: 420.0, 16: 990.0}}, inexact=(("peftbd", 16),))


def _row(b: int, speedup: float) -> ConcurrencyRow:
    return ConcurrencyRow("x", b, 100 * speedup, 2.0, True, speedup, 4.0)


def test_table_has_tok_s_and_speedup_per_batch_size(swept) -> None:
    table = concurrency_table(swept)
    assert table.splitlines()[0] == ("| arm | B=1 tok/s | B=1 vs AR | B=4 tok/s | B=4 vs AR | "
                                     "B=16 tok/s | B=16 vs AR | exact (= AR batch 1) |")
    assert "| AR | 100.0 | 1.00 | 380.0 | 1.00 | 900.0 | 1.00 | yes |" in table
    assert "| PEFT-BD 1 step | 150.0 | 1.50 | 400.0 | 1.05 | 720.0 | 0.80 | no (B = 16) |" in table
    assert "| FastMTP | 130.0 | 1.30 | 420.0 | 1.11 | 990.0 | 1.10 | yes |" in table
    assert concurrency_table(swept.model_copy(update={"concurrency": []})) == NO_SWEEP


def test_crossovers_are_computed_from_the_speedups(swept) -> None:
    assert crossovers(swept) == [
        "PEFT-BD 1 step: speedup over AR crosses below 1.0 between B=4 (1.05x) and B=16 (0.80x).",
        "FastMTP: speedup over AR stays at or above 1.0 from B=1 up to B=16 (1.30x, 1.11x, 1.10x).",
    ]
    assert crossover("x", [_row(1, 0.8), _row(8, 0.6)]) == (
        "x: speedup over AR stays below 1.0 from B=1 up to B=8 (0.80x, 0.60x).")
    assert crossover("x", [_row(1, 0.9), _row(4, 1.2), _row(16, 0.7)]) == (
        "x: speedup over AR crosses above 1.0 between B=1 (0.90x) and B=4 (1.20x), then crosses "
        "below 1.0 between B=4 (1.20x) and B=16 (0.70x).")


def test_engine_goal_met_missed_or_not_measured(sample_results, swept) -> None:
    assert engine_goal(swept).measured == pytest.approx(9.0)
    assert engine_goal_sentence(swept) == (
        "Engine goal: AR at batch 16 >= 8x its batch-1 aggregate tok/s: **met**, measured 9.00x "
        "(900.0 vs 100.0 tok/s).")
    slow = _with_sweep(sample_results, {"ar": {1: 100.0, 16: 500.0}})
    assert engine_goal_sentence(slow).endswith("**missed by 38%**, measured 5.00x (500.0 vs 100.0 tok/s).")
    no_16 = _with_sweep(sample_results, {"ar": {1: 100.0, 4: 300.0}})
    assert engine_goal(no_16).measured is None
    assert "not measured (decoding.batch_sizes lacks 1 or 16" in engine_goal_sentence(no_16)


def test_figure_3_draws_every_arm_and_speculative_speedups(swept) -> None:
    fig = throughput_vs_batch(swept)
    left, right = fig.axes
    lines = {line.get_label(): line for line in left.get_lines()}
    assert list(lines) == ["AR", "PEFT-BD 1 step", "FastMTP"]
    assert np.asarray(lines["FastMTP"].get_xdata()).tolist() == [1, 4, 16]
    assert np.asarray(lines["FastMTP"].get_ydata()).tolist() == [130.0, 420.0, 990.0]
    speedups = {line.get_label(): line for line in right.get_lines()}
    assert list(speedups) == ["PEFT-BD 1 step", "FastMTP", "AR (1.0)"]  # AR only as the 1.0 line
    assert np.asarray(speedups["PEFT-BD 1 step"].get_ydata()).tolist() == pytest.approx([1.5, 400 / 380, 0.8])
    assert left.get_xscale() == "log" and right.get_xscale() == "log"
    plt.close(fig)


def test_report_has_the_concurrency_section_and_figure(tmp_path, sample_results, swept) -> None:
    text = build_report(swept, {}, tmp_path / "swept").read_text()
    assert "## Table 8 and Figure 3" in text and f"![Figure 3]({FIGURE_3})" in text
    assert "greedy, batch 1 (and batch sizes 1, 4, 16: Table 8)" in text
    assert "- PEFT-BD 1 step: speedup over AR crosses below 1.0 between B=4" in text
    assert "- Engine goal: AR at batch 16 >= 8x its batch-1 aggregate tok/s: **met**" in text
    assert mpimg.imread(tmp_path / "swept" / FIGURE_3).shape[0] > 200
    assert "median over the 3 repeats (at B > 1 the first 1)" in text  # timing.sweep_repeats
    every = swept.model_copy(update={"timing": swept.timing.model_copy(update={"sweep_repeats": 3})})
    assert "median over the 3 repeats (at B > 1 the first 3)" in build_report(
        every, {}, tmp_path / "every").read_text()
    plain = build_report(sample_results, {}, tmp_path / "plain").read_text()
    assert NO_SWEEP in plain and not (tmp_path / "plain" / FIGURE_3).exists()


def test_short_passes_are_named(sample_results) -> None:
    results = _with_sweep(sample_results, {"ar": {1: 100.0, 16: 900.0}})
    results.concurrency[1] = dataclasses.replace(results.concurrency[1], wall_s=0.4)
    assert short_passes_note(results, 3.0) == (
        "**Too short to time reliably:** passes under 3 s: AR at B=16 (0.40 s); raise "
        "decoding.num_prompts or decoding.max_new_tokens.")
    assert short_passes_note(results, 0.1) is None
