"""The block-diffusion head's goals are judged from the numbers, and a miss names its term."""

from __future__ import annotations

from peftbd.analysis.head_goals import goals, goals_table, round_terms
from peftbd.benchmarking.schema import Arm


def test_goals_are_judged_and_misses_say_by_how_much(arm, results_of, cost_profile_of) -> None:
    results = results_of({
        "ar": arm("AR", "ar", [100.0], 1.0, round_ms=(0.0, 1.0)),
        "peftbd_head": arm("BD head", "peftbd_head", [140.0], 2.2, round_ms=(0.4, 1.6)),
    })
    results.cost_at_scale = cost_profile_of({"ar": (0.0, 300.0), "peftbd_head": (40.0, 400.0)})
    found = {g.name: g for g in goals(results, "peftbd_head")}
    assert found["speedup vs AR"].measured == 1.4 and found["speedup vs AR"].met
    assert found["draft / verify per round"].measured == 0.25 and found["draft / verify per round"].met
    accepted = found["accepted tokens / round"]
    assert not accepted.met and accepted.verdict() == "missed by 12%"  # 2.2 vs >= 2.5
    assert found["draft / verify per round at scale"].measured == 0.1
    table = goals_table(results)
    assert "| BD head | accepted tokens / round | 2.20 | >= 2.5 | missed by 12% |" in table
    assert "speedup = 2.20 accepted / round x AR step 1.00 ms" in table
    assert round_terms(results, "peftbd_head").endswith(
        "(draft 0.40 + verify 1.60 + other 4.00 AR steps)")  # t0 6 ms: 4 ms beyond draft + verify


def test_without_a_head_arm_or_profile_nothing_is_invented(arm, results_of) -> None:
    results = results_of({"ar": arm("AR", "ar", [100.0], 1.0)})
    assert goals(results, "peftbd_head") is None
    assert goals_table(results) == "_No block-diffusion head arm in this run._"
    results.arms["peftbd_head"] = Arm.model_validate(arm("BD head", "peftbd_head", [90.0], 2.6))
    at_scale = goals(results, "peftbd_head")[-1]
    assert at_scale.measured is None and at_scale.verdict() == "not measured"
