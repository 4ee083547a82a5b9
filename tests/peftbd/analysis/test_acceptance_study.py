"""The acceptance study's report: tables, effects against intervals, the deciding factor, figure."""

from peftbd.analysis.acceptance_study import deciding_paragraph, effects, study_figure, study_markdown
from peftbd.benchmarking.acceptance_study import MIX, Cell, Study, Variant, VariantFacts


def _facts(name: str, factor: str, level: float) -> VariantFacts:
    return VariantFacts(Variant(name, factor, level), 2, 192, 1_500_000, 1200, 0.8, {"train_mtp": 100})


def _study() -> Study:
    def c(variant, arm, cat, tpr, half=0.05):
        return Cell(variant, arm, cat, 96, 4000, tpr, (tpr - half, tpr + half), 0.3)

    cells = [c("base", "peftbd", MIX, 1.40), c("base", "peftbd", "recall", 1.10),
             c("base", "peftbd", "formulaic", 2.40),
             c("depth4", "peftbd", MIX, 1.80), c("budget4x", "peftbd", MIX, 1.43),
             c("base", "fastmtp", MIX, 1.60), c("depth4", "fastmtp", MIX, 1.62),
             c("budget4x", "fastmtp", MIX, 1.90)]
    return Study([_facts("base", "base", 1), _facts("depth4", "depth", 4),
                  _facts("budget4x", "budget", 4)], cells)


def test_effects_are_resolved_only_beyond_the_combined_intervals():
    found = {(e.arm, e.factor): e for e in effects(_study())}
    assert found["peftbd", "depth"].delta == 0.4 and found["peftbd", "depth"].resolved
    assert found["peftbd", "budget"].delta == 0.03 and not found["peftbd", "budget"].resolved
    assert found["peftbd", "content"].where == "formulaic vs recall"
    assert found["peftbd", "content"].delta == 1.3
    assert not found["fastmtp", "depth"].resolved and found["fastmtp", "budget"].resolved
    assert ("fastmtp", "content") not in found  # no categories replayed for it


def test_the_deciding_factor_is_the_largest_mean_move():
    text = deciding_paragraph(_study())
    assert text.startswith("**The deciding factor is content**")  # 1.3 vs depth 0.21, budget 0.165
    assert "depth +0.40 (depth4, resolved)" in text and "budget +0.03 (budget4x, within noise)" in text


def test_markdown_and_figure(tmp_path):
    text = study_markdown(_study())
    assert "| peftbd | 1.40 (1.35-1.45) | 1.80 (1.75-1.85) | 1.43 (1.38-1.48) |" in text
    assert "| base | peftbd | 2.40 (2.35-2.45), p1 0.30 | 1.10 (1.05-1.15), p1 0.30 |" in text
    study_figure(_study(), tmp_path / "study.png")
    assert (tmp_path / "study.png").read_bytes()[:4] == b"\x89PNG"


def test_report_section_from_the_study_manifest():
    from peftbd.analysis.acceptance_study import mix_table, study_section

    assert study_section(None, "acceptance_study") == []
    manifest = {"mix_table": mix_table(_study()), "deciding": deciding_paragraph(_study())}
    section = study_section(manifest, "acceptance_study")
    assert section[0].startswith("## What decides acceptance")
    assert "`acceptance_study/study.md`" in section[1]
    assert section[2:] == [manifest["mix_table"], manifest["deciding"]]
