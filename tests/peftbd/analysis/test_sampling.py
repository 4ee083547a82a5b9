"""The report's sampling section from a hand-made results.json `sampling` block: Table 11, the
invalid-samples note, Figure 5, and nothing for results from before sampling."""

from __future__ import annotations

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pytest

from peftbd.analysis.figures import acceptance_vs_temperature
from peftbd.analysis.report import FIGURE_5, build_report
from peftbd.analysis.sampling import TITLE, intro_words, section, survives
from peftbd.benchmarking.sampled import SKIPPED
from peftbd.benchmarking.schema import Results, Sampling


def _entry(t: float, accepted: float, rates: list[float], tps: float,
           invalid: list[str] | None = None) -> dict:
    """One `sampling.arms.*.by_temperature` entry over 100 rounds (`rates`: per position)."""
    check = None if t == 0 else {"prompts": 16, "valid": 16 - len(invalid or []),
                                 "invalid": invalid or []}
    hits = [round(100 * r) for r in rates]
    reached = [100, *hits[:-1]] if hits else []
    return {"temperature": t, "mean_accepted": accepted, "tokens_per_s": tps,
            "mean_accepted_prefix": accepted - 1, "token_acceptance": None, "new_tokens": 480,
            "decode_s": 480 / tps, "rounds": 100, "check": check,
            "per_position": {"proposed": [100] * len(rates), "reached": reached, "accepted": hits,
                             "rate": rates, "conditional": [a / n for a, n in zip(hits, reached)]}}


def _sampling(results: Results) -> Sampling:
    assert results.sampling is not None
    return results.sampling


def _with_sampling(results: Results, invalid: list[str] | None = None) -> Results:
    """AR; PEFT-BD keeping 0.75 of its acceptance at T = 1; FastMTP as a synthetic arm."""
    arms = {
        "ar": {"label": "AR", "skipped": None,
               "by_temperature": [_entry(0.0, 1.0, [], 400.0), _entry(1.0, 1.0, [], 390.0)]},
        "peftbd": {"label": "PEFT-BD 1 step", "skipped": None,
                   "by_temperature": [_entry(0.0, 2.0, [0.6, 0.3], 122.5),
                                      _entry(1.0, 1.5, [0.4, 0.1], 101.25, invalid)]},
        "fastmtp": {"label": "FastMTP", "skipped": SKIPPED,
                    "by_temperature": [_entry(0.0, 1.81, [0.7], 310.0)]},
    }
    return results.model_copy(update={"sampling": Sampling.model_validate(
        {"temperatures": [0.0, 1.0], "seed": 0, "prompts": 16, "how": "", "arms": arms})})


def test_table_11_gives_each_arm_per_temperature_and_what_survives(sample_results) -> None:
    results = _with_sampling(sample_results)
    text = "\n\n".join(section(results, FIGURE_5))
    assert survives(_sampling(results).arms["peftbd"], 1.0) == 0.75
    assert ("| arm | T=0 tokens / round | T=0 position-1 acceptance | T=0 tok/s | T=1 tokens / round "
            "| T=1 position-1 acceptance | T=1 tok/s | T=1 survives | T=1 valid samples | note |") in text
    assert "| AR | 1.00 | n/a | 400.0 | 1.00 | n/a | 390.0 | 1.00 | 16/16 |  |" in text
    assert "| PEFT-BD 1 step | 2.00 | 0.60 | 122.5 | 1.50 | 0.40 | 101.2 | 0.75 | 16/16 |  |" in text
    assert (f"| FastMTP | 1.81 | 0.70 | 310.0 | skipped | skipped | skipped | skipped | skipped "
            f"| {SKIPPED} |") in text
    assert "proven by the statistical tests" in text and "not by the audit" in text
    assert "first 16 prompts" in text and f"![Figure 5]({FIGURE_5})" in text
    assert "Invalid samples" not in text
    assert intro_words(results) == " (and sampled at T = 1: Table 11)"


def test_invalid_samples_are_named_and_old_or_greedy_results_say_so(sample_results) -> None:
    text = "\n\n".join(section(_with_sampling(sample_results, ["p3"]), FIGURE_5))
    assert "**Invalid samples** (prompt ids): PEFT-BD 1 step at T=1: p3." in text
    assert "| 15/16 |" in text
    assert section(sample_results, FIGURE_5) == [] and intro_words(sample_results) == ""
    greedy_only = _with_sampling(sample_results)
    _sampling(greedy_only).temperatures = [0.0]
    assert section(greedy_only, FIGURE_5) == [
        TITLE, "_No temperature > 0 in this run (decoding.temperatures)._"]


def test_figure_5_draws_each_arm_that_samples_against_the_temperature(sample_results) -> None:
    fig = acceptance_vs_temperature(_with_sampling(sample_results))
    lines = {l.get_label(): l for l in fig.axes[0].get_lines()}
    assert list(lines) == ["AR", "PEFT-BD 1 step"]  # not the synthetic arm
    assert np.asarray(lines["PEFT-BD 1 step"].get_xdata()).tolist() == [0.0, 1.0]
    assert np.asarray(lines["PEFT-BD 1 step"].get_ydata()).tolist() == [2.0, 1.5]
    plt.close(fig)


@pytest.mark.parametrize("sampled", [True, False])
def test_the_report_holds_table_11_and_figure_5_only_with_sampling(sample_results, tmp_path,
                                                                   sampled) -> None:
    results = _with_sampling(sample_results) if sampled else sample_results
    text = build_report(results, {}, tmp_path).read_text()
    assert ("Table 11" in text) is sampled and (tmp_path / FIGURE_5).exists() is sampled
    if sampled:
        assert mpimg.imread(tmp_path / FIGURE_5).shape[0] > 200
