"""The per-category acceptance section: a row per speculative arm, a cell per category with tokens
per round, its 95% interval and position-1 acceptance; throughput per category beside it; and
sentences computed from the intervals (which drafters are resolved apart, the best drafter's
easiest vs hardest category). No ± of a single repeat anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peftbd.analysis import categories, tables
from peftbd.analysis.readme_table import render
from peftbd.analysis.report import build_report, summary_lines
from peftbd.benchmarking.schema import SCHEMA, Results, stat
from peftbd.errors import UserError


def _category(accepted: float, ci: tuple[float, float] | None, p1: float | None,
              tps: float, repeats: int = 3, prompts: int = 8) -> dict:
    return {"prompts": prompts, "tokens_per_s": stat([tps] * repeats).model_dump(),
            "mean_accepted": stat([accepted] * repeats).model_dump(), "mean_accepted_ci95": ci,
            "position1_acceptance": p1, "rounds": 40 * repeats}


def _results(arm, results_of, repeats: int = 3) -> Results:
    """AR; A and B overlap on the whole mix (1.30-1.45 vs 1.40-1.55); C (1.80-1.95) is apart
    from both; a synthetic arm (acceptance set, not measured) overlaps A but is no drafter here.
    Categories: recall (easy) and formulaic (hard)."""
    tps = [100.0 + i for i in range(repeats)]
    arms = {
        "ar": arm("AR", "ar", [400.0] * repeats, 1.0),
        "a": arm("Drafter A", "peftbd", tps, 1.37, accepted_ci95=(1.30, 1.45)),
        "b": arm("Drafter B", "fastmtp", tps, 1.47, accepted_ci95=(1.40, 1.55)),
        "c": arm("Drafter C", "dflash", tps, 1.87, accepted_ci95=(1.80, 1.95)),
        "a_synthetic": arm("Drafter A [synthetic: 1.4/round]", "peftbd", tps, 1.40,
                           accepted_ci95=(1.35, 1.44)),
    }
    arms["a_synthetic"]["settings"] = {"synthetic": 1.4}
    for arm_id, (easy, hard) in {"a": (1.5, 1.25), "b": (1.6, 1.35), "c": (2.1, 1.5),
                                 "a_synthetic": (1.4, 1.4)}.items():
        arms[arm_id]["by_category"] = {
            "recall": _category(easy, (easy - 0.1, easy + 0.1), 0.61, 150.0, repeats),
            "formulaic": _category(hard, (hard - 0.1, hard + 0.1), 0.234, 90.0, repeats)}
    arms["ar"]["by_category"] = {"recall": _category(1.0, None, None, 401.0, repeats),
                                 "formulaic": _category(1.0, None, None, 399.0, repeats)}
    results = results_of(arms)
    results.timing.repeats = repeats
    return results


def test_the_category_table_has_a_row_per_speculative_arm_with_intervals_and_position_1(
        arm, results_of) -> None:
    table = categories.acceptance_table(_results(arm, results_of))
    lines = table.splitlines()
    assert lines[0] == "| arm | formulaic (8 prompts) | recall (8 prompts) |"
    assert lines[2] == "| Drafter A | 1.25 (1.15-1.35), p1 0.23 | 1.50 (1.40-1.60), p1 0.61 |"
    assert lines[4] == "| Drafter C | 1.50 (1.40-1.60), p1 0.23 | 2.10 (2.00-2.20), p1 0.61 |"
    assert len(lines) == 2 + 4 and "| AR |" not in table  # the speculative arms only
    throughput = categories.throughput_table(_results(arm, results_of))
    assert "| AR | 399.0 | 401.0 |" in throughput
    assert "| Drafter A | 90.0 | 150.0 |" in throughput  # 3 equal repeats: no "± 0.0"


def test_the_sentences_say_which_drafters_are_resolved_apart_and_the_best_one_s_spread(
        arm, results_of) -> None:
    results = _results(arm, results_of)
    apart, together = categories.resolution(results)
    assert apart == [("Drafter A", "Drafter C"), ("Drafter B", "Drafter C")]
    assert together == [("Drafter A", "Drafter B")]
    assert categories.resolution_sentence(results) == (
        "On the whole prompt mix, resolved apart (95% intervals of tokens per round disjoint): "
        "Drafter A vs Drafter C, Drafter B vs Drafter C; the other 1 pair(s) of drafters overlap.")
    assert categories.spread_sentence(results) == (
        "Best drafter by tokens per round, Drafter C (1.87 (1.80-1.95)): easiest category recall "
        "at 2.10 (2.00-2.20) vs hardest formulaic at 1.50 (1.40-1.60), 1.40x; their intervals "
        "are disjoint.")


def _with_mix(results: Results) -> Results:
    """The equal-weight mix on each drafter: A (1.20-1.30) now apart from B (1.35-1.50) and C
    (1.45-1.60), which overlap, the other way round from their pooled intervals."""
    for arm_id, (mix, ci) in {"a": (1.25, (1.20, 1.30)), "b": (1.42, (1.35, 1.50)),
                              "c": (1.52, (1.45, 1.60)), "a_synthetic": (1.4, (1.38, 1.42))}.items():
        results.arms[arm_id].mix_accepted, results.arms[arm_id].mix_accepted_ci95 = mix, ci
    return results


def test_the_mix_is_the_table_s_last_column_and_decides_what_is_resolved_apart(
        tmp_path: Path, arm, results_of) -> None:
    results = _with_mix(_results(arm, results_of))
    report = build_report(results, {}, tmp_path).read_text()
    assert "| 1.50 (1.40-1.60), p1 0.61 | 1.25 (1.20-1.30) |" in report.split(categories.TITLE)[1]
    lines = categories.acceptance_table(results).splitlines()
    assert lines[0] == ("| arm | formulaic (8 prompts) | recall (8 prompts) | "
                        f"{categories.MIX_COLUMN} |")
    assert lines[2].endswith("| 1.50 (1.40-1.60), p1 0.61 | 1.25 (1.20-1.30) |")  # Drafter A
    assert lines[4].endswith("| 1.52 (1.45-1.60) |")  # Drafter C
    assert categories.mix_interval(results.arms["a"]) == (1.20, 1.30)
    apart, together = categories.resolution(results)
    assert apart == [("Drafter A", "Drafter B"), ("Drafter A", "Drafter C")]
    assert together == [("Drafter B", "Drafter C")]
    results.arms["b"].mix_accepted_ci95 = None  # a category of B's under 2 prompts
    assert categories.resolution(results) == ([("Drafter A", "Drafter C")], [])


def test_without_the_mix_the_table_has_no_mix_column_and_the_pooled_intervals_resolve(
        arm, results_of) -> None:
    results = _results(arm, results_of)
    assert categories.MIX_COLUMN not in categories.acceptance_table(results)
    assert categories.mix_interval(results.arms["a"]) == (1.30, 1.45)  # mean_accepted_ci95


def test_drafters_all_apart_or_without_intervals(arm, results_of) -> None:
    results = _results(arm, results_of)
    results.arms["b"].mean_accepted_ci95 = (1.46, 1.50)  # now apart from A and C too
    assert categories.resolution(results)[1] == []
    assert categories.resolution_sentence(results).endswith("the other 0 pair(s) of drafters overlap.")
    for a in results.arms.values():
        a.mean_accepted_ci95 = None
    assert categories.resolution_sentence(results).startswith("Fewer than two drafters")


def test_the_report_holds_the_section_and_table_2_the_interval(
        tmp_path: Path, arm, results_of) -> None:
    text = build_report(_results(arm, results_of), {}, tmp_path).read_text()
    section = text.split(categories.TITLE, 1)[1].split("\n## ", 1)[0]
    assert "| Drafter B | 1.35 (1.25-1.45), p1 0.23 | 1.60 (1.50-1.70), p1 0.61 |" in section
    assert "the other 1 pair(s) of drafters overlap." in section
    assert "1.40x; their intervals are disjoint." in section
    assert "| Drafter A | 1.37 (1.30-1.45) | 25.0% |" in text  # Table 2
    assert "| AR | 1.00 | n/a |" in text  # AR: no interval


def test_no_section_without_categories(sample_results) -> None:
    for a in sample_results.arms.values():
        a.by_category = {}
    assert categories.section(sample_results) == []


def test_a_single_repeat_prints_values_without_a_std(tmp_path: Path, arm, results_of) -> None:
    results = _results(arm, results_of, repeats=1)
    for a in results.arms.values():
        a.tokens_per_s.ci95 = None
    outputs = [tables.acceptance_table(results), tables.repeats_table(results),
               categories.throughput_table(results), "\n".join(summary_lines(results)),
               render(results)]
    assert not [o for o in outputs if "±" in o]
    assert "| Drafter A | 90.0 | 150.0 |" in outputs[2]
    report = build_report(results, {}, tmp_path).read_text()
    assert "± 0.0" not in report


def test_results_json_round_trips_the_new_fields_and_refuses_version_3(
        tmp_path: Path, arm, results_of) -> None:
    results = _results(arm, results_of)
    path = tmp_path / "results.json"
    results.write(path)
    back = Results.read(path)
    assert back == results and back.arms["c"].by_category["recall"].position1_acceptance == 0.61
    old = json.loads(path.read_text())
    old["schema"] = "peftbd-benchmark/3"
    for a in old["arms"].values():
        del a["mean_accepted_ci95"]
    path.write_text(json.dumps(old))
    with pytest.raises(UserError) as exc:
        Results.read(path)
    assert ("schema 'peftbd-benchmark/3', this code reads 'peftbd-benchmark/4'" in str(exc.value)
            and "rerun the benchmark" in str(exc.value))
    old["schema"] = SCHEMA
    path.write_text(json.dumps(old))
    with pytest.raises(UserError) as exc:
        Results.read(path)
    assert "`arms.ar.mean_accepted_ci95`" in str(exc.value)
