"""No false precision: a spread is a std over more than one repeat or the 95% interval over the
prompts, never the std of one run nor a "± 0.0", and tok/s carries at most 1 decimal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from peftbd.analysis import tables
from peftbd.analysis.report import build_report
from peftbd.benchmarking.schema import Results


def _runs(arm, results_of, tps: dict[str, list[float]]) -> Results:
    """AR, PEFT-BD and FastMTP with these runs' tok/s; every tok/s with an interval over the
    prompts (as results.json carries one)."""
    results = results_of({
        "ar": arm("AR", "ar", tps["ar"], 1.0),
        "peftbd": arm("PEFT-BD 1 step", "peftbd", tps["peftbd"], 1.37, draft_call_ms=2.6,
                      accepted_per_position=[60, 30, 12, 4]),
        "fastmtp": arm("FastMTP", "fastmtp", tps["fastmtp"], 1.81, draft_call_ms=0.4,
                       accepted_per_position=[70, 45, 25]),
    })
    results.timing.repeats = len(tps["ar"])
    for a in results.arms.values():
        a.tokens_per_s.ci95 = (a.tokens_per_s.mean * 0.95, a.tokens_per_s.mean * 1.05)
    return results


@pytest.fixture
def one_repeat(arm, results_of) -> Results:
    return _runs(arm, results_of, {"ar": [595.05], "peftbd": [190.05], "fastmtp": [294.76]})


@pytest.fixture
def three_repeats(arm, results_of) -> Results:
    return _runs(arm, results_of, {"ar": [590.0, 600.0, 610.0], "peftbd": [189.0, 190.0, 191.0],
                                   "fastmtp": [294.0, 294.0, 294.0]})


def _section(report: str, heading: str) -> str:
    return report.split(heading, 1)[1].split("\n## ", 1)[0]


def _tps_decimals(cells: list[str]) -> int:
    """The most decimals of any number in `cells`."""
    return max((len(d) for c in cells for d in re.findall(r"\d+\.(\d+)", c)), default=0)


def _column(table: str, header: str) -> list[str]:
    lines = [l.strip("|").split(" | ") for l in table.splitlines() if l.startswith("| ")]
    i = [h.strip() for h in lines[0]].index(header)
    return [row[i].strip() for row in lines[1:]]


def test_one_repeat_shows_the_interval_over_prompts_and_no_std(one_repeat, tmp_path: Path) -> None:
    report = build_report(one_repeat, {}, tmp_path).read_text()
    for heading in ("## Summary", "## Table 2", "## Table 3", "Throughput per category"):
        numbers = [l for l in _section(report, heading).splitlines() if l.startswith(("|", "- "))]
        assert numbers and not [l for l in numbers if "±" in l], heading  # prose: interval widths
    assert "595.05" not in report and "± 0.0" not in report
    table2 = tables.acceptance_table(one_repeat)
    assert _column(table2, "tok/s (95% interval)")[0] == "595.0 (565.3-624.8)"
    table3 = tables.repeats_table(one_repeat)
    assert "run 1" not in table3 and "mean ± std" not in table3  # one run: no duplicate, no std
    assert _column(table3, "tok/s 95% interval")[0] == "[565.3, 624.8]"
    assert _tps_decimals(_column(table3, "tok/s (mean)") + _column(table2, "tok/s (95% interval)")) == 1
    assert _tps_decimals(_column(table3, "accepted / round")) == 2


def test_several_repeats_show_each_run_and_a_real_std(three_repeats, tmp_path: Path) -> None:
    table3 = tables.repeats_table(three_repeats)
    assert "| AR | 590.0 | 600.0 | 610.0 | 600.0 ± 10.0 | 600.0 |" in table3
    assert "| FastMTP | 294.0 | 294.0 | 294.0 | 294.0 | 294.0 |" in table3  # std 0: none shown
    assert _tps_decimals(_column(table3, "tok/s (mean ± std)")) == 1
    report = build_report(three_repeats, {}, tmp_path).read_text()
    assert "± 0.0" not in report and "± 0.00" not in report
    assert "3 timed runs per arm" in report


def test_fmt_stat_drops_a_spread_of_one_run_or_of_zero() -> None:
    from peftbd.benchmarking.schema import Stat

    assert tables.fmt_stat(Stat(mean=595.05, std=0.0), 1, repeats=1) == "595.0"
    assert tables.fmt_stat(Stat(mean=595.05, std=3.0), 1, repeats=1) == "595.0"
    assert tables.fmt_stat(Stat(mean=595.05, std=0.01), 1, repeats=3) == "595.0"
    assert tables.fmt_stat(Stat(mean=595.05, std=2.5), 1, repeats=3) == "595.0 ± 2.5"
