"""The paper's findings judged per category: a category's view swaps in its own acceptance and
throughput, and a finding whose verdict differs between categories is said to depend on the world."""

from __future__ import annotations

from peftbd.analysis.findings_by_category import category_view, findings_by_category, section
from peftbd.benchmarking.schema import stat


def _cat(accepted: float, tps: float) -> dict:
    return {"prompts": 4, "tokens_per_s": stat([tps]).model_dump(),
            "mean_accepted": stat([accepted]).model_dump(), "mean_accepted_ci95": None,
            "position1_acceptance": 0.5, "rounds": 40}


def _results(arm, results_of):
    arms = {"ar": arm("AR", "ar", [400.0], 1.0), "peftbd": arm("PEFT-BD", "peftbd", [120.0], 1.4),
            "fastmtp": arm("FastMTP", "fastmtp", [300.0], 1.8)}
    # (a) PEFT-BD accepts more than FastMTP yet decodes slower: only on grounded prompts
    arms["ar"]["by_category"] = {"grounded": _cat(1.0, 400.0), "recall": _cat(1.0, 400.0)}
    arms["peftbd"]["by_category"] = {"grounded": _cat(3.0, 200.0), "recall": _cat(1.2, 100.0)}
    arms["fastmtp"]["by_category"] = {"grounded": _cat(2.0, 320.0), "recall": _cat(1.5, 290.0)}
    return results_of(arms)


def test_a_category_view_is_that_category_s_numbers(arm, results_of):
    view = category_view(_results(arm, results_of), "grounded")
    assert view.arms["peftbd"].mean_accepted.mean == 3.0
    assert view.arms["fastmtp"].tokens_per_s.mean == 320.0
    assert view.arms["peftbd"].oracle is None  # fitted to all prompts: not a category's


def test_findings_that_change_with_the_content_are_named(arm, results_of):
    table = findings_by_category(_results(arm, results_of))
    assert table is not None
    lines = table.splitlines()
    assert lines[0] == "| finding | all prompts | grounded | recall |"
    assert lines[2] == "| (a) | **not** | holds | **not** |"
    assert "Depends on the content (its verdict differs between categories): (a);" in table
    assert "(f)" not in table.split("the same in every category:")[1].split(".")[0]  # oracle-based


def test_no_section_without_categories(arm, results_of):
    results = _results(arm, results_of)
    for a in results.arms.values():
        a.by_category = {}
    assert findings_by_category(results) is None and section(results) == []
