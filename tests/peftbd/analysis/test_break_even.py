"""The paper's question at its own acceptance (Table 10, Figure 4) and the measured decode at the
paper's architecture (Table 9), from results.json alone."""

from __future__ import annotations

import copy

import pytest

from peftbd.analysis import break_even
from peftbd.analysis.report import FIGURE_4, build_report
from peftbd.benchmarking.cost_profile_schema import CostProfile
from peftbd.benchmarking.schema import Arm, Results


def _profile(results: Results) -> CostProfile:
    assert results.cost_at_scale is not None
    return results.cost_at_scale


@pytest.fixture
def profiled(sample_results, cost_profile_of, arm) -> Results:
    """The sample run with a cost profile: at the roofline an AR step is 1 ms and a PEFT-BD round
    2 ms (draft = verify = an AR step), FastMTP's 1.3 ms; plus a synthetic head arm at 5.3."""
    results = copy.deepcopy(sample_results)
    results.arms["peftbd_head"] = Arm.model_validate(
        arm("BD head", "peftbd_head", [100.0], 1.5, draft_call_ms=0.5))
    synthetic = arm("BD head [synthetic: 5.3/round]", "peftbd_head", [200.0], 5.2, draft_call_ms=0.5)
    synthetic["settings"] = {"synthetic": 5.3}
    results.arms["peftbd_head_synthetic"] = Arm.model_validate(synthetic)
    results.cost_at_scale = cost_profile_of({"ar": (0.0, 100.0), "peftbd": (100.0, 100.0),
                                             "fastmtp": (30.0, 100.0),
                                             "peftbd_head": (20.0, 100.0)})
    return results


def test_the_roofline_prices_each_arm_at_its_reference_acceptance(profiled):
    refs = break_even.reference_acceptance(profiled)
    assert refs == {"peftbd": (2.881, "the paper"), "fastmtp": (1.511, "the paper"),
                    "peftbd_head": (5.3, "synthetic")}
    roof = break_even.cost_sources(profiled)[-1]
    assert roof.name == "Qwen/Qwen3-0.6B bf16, H200 roofline"
    assert roof.break_even("peftbd") == pytest.approx(2.0)
    assert roof.speedup("peftbd", 2.881) == pytest.approx(1.4405)
    assert roof.speedup("fastmtp", 1.511) == pytest.approx(1.511 / 1.3)
    row = next(r for r in break_even.rows(profiled)
               if r.arm == "peftbd" and r.source == roof.name)
    assert row.accepted == pytest.approx(1.37) and row.speedup_here == pytest.approx(0.685)


def test_the_verdict_is_computed_from_the_roofline(profiled):
    lines = break_even.verdict(profiled)
    assert "**1.44x** greedy AR (break-even 2.00" in lines[0] and "**does not survive**" in lines[0]
    assert "under **0.881 ms**" in lines[1]  # 2.881 AR steps of 1 ms minus a 2 ms round
    slow = copy.deepcopy(profiled)
    _profile(slow).roofline.arms["peftbd"].roofline_draft_ms = 3.0
    assert "**survives**" in break_even.verdict(slow)[0]  # 2.881 / 4 < 1
    assert break_even.verdict(profiled.model_copy(update={"cost_at_scale": None})) == []


def test_the_report_has_table_10_and_figure_4(tmp_path, profiled, sample_results):
    text = build_report(profiled, {}, tmp_path / "r").read_text()
    section = text.split("## Table 10", 1)[1].split("\n## ", 1)[0]
    assert "does not survive" in section and "2.88 (the paper)" in section and "5.30 (synthetic)" in section
    assert (tmp_path / "r" / FIGURE_4).read_bytes()[:4] == b"\x89PNG"
    bare = build_report(sample_results, {}, tmp_path / "bare").read_text()  # no cost profile
    section = bare.split("## Table 10", 1)[1].split("\n## ", 1)[0]
    assert "this run (embedded:tiny), measured" in section and "roofline" not in section
    assert "does not survive" not in section and "survives" not in section


def test_table_9_sets_the_measured_decode_against_the_floor(tmp_path, profiled, eager_cpu):
    def arm(label, synthetic, tps, draft):
        return {**eager_cpu, "label": label, "synthetic": synthetic, "tokens": 64, "rounds": 20,
                "seconds": 64 / tps, "tokens_per_s": tps, "speedup_vs_ar": tps / 2.0,
                "mean_accepted": synthetic or 1.0,
                "exact": True, "draft_ms_round": draft, "verify_ms_round": 400.0, "host_ms_round": 3.0,
                "draft_ms_forward": draft or None, "verify_ms_forward": 400.0,
                "floor_draft_ms_round": 100.0, "floor_verify_ms_forward": 160.0,
                "draft_x_over_floor": draft / 100.0 if draft else None, "verify_x_over_floor": 2.5}

    profiled.cost_at_scale = CostProfile.from_dict({**_profile(profiled).to_dict(), "decode": {
        "prompts": 2, "prompt_len": 512, "max_new_tokens": 32, "dtype": "float32", "seed": 0,
        "floor": {"device": "cpu", "dtype": "float32", "bytes_per_s": 2e10, "flops_per_s": 1e11,
                  "source": "measured"},
        "arms": {"ar": arm("AR", None, 2.0, 0.0),
                 "peftbd_synthetic": arm("PEFT-BD [synthetic: 2.881/round]", 2.881, 3.1, 420.0)}}})
    text = build_report(profiled, {}, tmp_path).read_text()
    table = text.split("## Table 9", 1)[1].split("\n## ", 1)[0]
    assert "SYNTHETIC" in table and "20.0 GB/s" in table
    assert "| PEFT-BD [synthetic: 2.881/round] | 2.88 | 2.88 | 3.1 | 1.55 | yes | 420.0 / 400.0 / 3.0 | 4.2 | 400.0 (160.0) | 2.5 |" in table
    decoded = next(s for s in break_even.cost_sources(profiled) if "decoded" in s.name)
    assert decoded.ar_ms == pytest.approx(403.0) and decoded.round_ms["peftbd"] == pytest.approx(823.0)
