"""The README's results table: rendered from results.json (+ the main job's manifest), written
between the README's markers only, idempotently, with one-line errors; README.md has one pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peftbd.analysis.readme_table import (
    BEGIN,
    END,
    ReadmeTableError,
    main,
    render,
    replace_between_markers,
    update_readme,
)
from peftbd.benchmarking.schema import DrafterInfo, Results, Speedup

REPO = Path(__file__).resolve().parents[3]
MANIFEST = {"preset": "tiny", "wall_seconds": 1541.4,
            "stages": [{"stage": "world", "ran": False}, {"stage": "generate", "ran": True},
                       {"stage": "benchmark", "ran": True}]}
README = f"# title\n\nbefore the table\n\n{BEGIN}\nplaceholder\n{END}\n\nafter the table\n"


def _run_root(tmp_path: Path, results: Results, manifest: dict | None = MANIFEST) -> Path:
    root = tmp_path / "out"
    (root / "benchmark").mkdir(parents=True)
    results.write(root / "benchmark" / "results.json")
    if manifest is not None:
        (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_render_one_row_per_arm_from_results(sample_results):
    text = render(sample_results, MANIFEST)
    table, caption = text.split("\n\n")
    lines = table.splitlines()
    assert lines[0] == ("| arm | accepted tokens / round | tok/s, batch 1 | speedup vs AR "
                        "| exact audit |")
    # AR 400.3 tok/s; PEFT-BD 122.5 (0.31x AR), 1.37 accepted (1.32-1.41 over the prompts);
    # FastMTP 310.0 (0.77x), 1.81; AR has no acceptance interval
    assert lines[2] == "| AR | 1.00 | 400.3 ± 1.0 | 1.00 | reference |"
    assert lines[3] == "| PEFT-BD 1 step | 1.37 (1.32-1.41) | 122.5 ± 0.8 | 0.31 | 16/16 |"
    assert lines[4] == "| FastMTP | 1.81 (1.76-1.85) | 310.0 ± 1.0 | 0.77 | 16/16 |"
    assert len(lines) == 5
    assert caption == ("_preset `tiny`; 16 test prompts x 48 new tokens, greedy, 3 timed repeats "
                       "per arm; test CPU (cpu, float32); run of 2025-01-01; main job 25 min 41 s "
                       "(2 of 3 stages ran)._")


def test_caption_without_manifest_or_with_another_presets(sample_results):
    assert "main job" not in render(sample_results, None)
    assert "main job" not in render(sample_results, {**MANIFEST, "preset": "tiny-full"})


def test_single_repeat_shows_the_mean_and_a_missing_ar_leaves_no_speedup(arm, results_of):
    results = results_of({"peftbd": arm("PEFT-BD 1 step", "peftbd", [123.25], 1.37,
                                        draft_call_ms=2.6)})
    results.arms["peftbd"].mean_accepted_ci95 = None  # under 2 prompts
    results.timing.repeats = 1
    row = render(results).split("\n\n")[0].splitlines()[2]
    assert row == "| PEFT-BD 1 step | 1.37 | 123.2 | n/a | 16/16 |"
    assert "1 timed repeat per arm" in render(results)


def test_untrained_drafters_are_named_in_the_caption(sample_results):
    sample_results.drafters = {"mtp_head": DrafterInfo(
        path="/a/mtp_head", untrained=True, untrained_reasons=["fastmtp.optim.max_steps=0"])}
    assert "Untrained drafters" in render(sample_results).split("\n\n")[1]


def test_replacement_touches_nothing_outside_the_markers_and_is_idempotent(sample_results):
    block = render(sample_results, MANIFEST)
    once = replace_between_markers(README, block)
    assert once.startswith(f"# title\n\nbefore the table\n\n{BEGIN}\n")
    assert once.endswith(f"\n{END}\n\nafter the table\n")
    assert once == f"# title\n\nbefore the table\n\n{BEGIN}\n{block}\n{END}\n\nafter the table\n"
    assert replace_between_markers(once, block) == once


@pytest.mark.parametrize("text", [
    "no markers at all\n", f"{BEGIN}\nonly a begin\n", f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n",
    f"{END}\nwrong order\n{BEGIN}\n",
])
def test_marker_errors_are_one_line(text):
    with pytest.raises(ReadmeTableError) as exc:
        replace_between_markers(text, "table")
    assert "\n" not in str(exc.value) and BEGIN in str(exc.value)


def test_update_readme_writes_once_then_is_current(tmp_path, sample_results):
    root = _run_root(tmp_path, sample_results)
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert update_readme(root, readme) is True
    first = readme.read_text()
    assert "| PEFT-BD 1 step | 1.37 (1.32-1.41) |" in first and "placeholder" not in first
    assert update_readme(root, readme) is False
    assert readme.read_text() == first


def test_update_readme_without_a_pipeline_manifest(tmp_path, sample_results):
    root = _run_root(tmp_path, sample_results, manifest=None)
    readme = tmp_path / "README.md"
    readme.write_text(README)
    update_readme(root, readme)
    assert "| AR |" in readme.read_text() and "main job" not in readme.read_text()


def test_cli_errors_are_one_line_and_leave_the_readme_alone(tmp_path, sample_results, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(README)
    with pytest.raises(SystemExit) as exc:  # no results under that root
        main([str(tmp_path / "nowhere"), "--readme", str(readme)])
    assert str(exc.value).startswith("error: no benchmark results at ")
    assert "python -m jobs.pipeline" in str(exc.value) and "\n" not in str(exc.value)
    root = _run_root(tmp_path, sample_results)
    no_markers = tmp_path / "OTHER.md"
    no_markers.write_text("# no markers\n")
    with pytest.raises(SystemExit) as exc:
        main([str(root), "--readme", str(no_markers)])
    assert str(exc.value).startswith("error: ") and "\n" not in str(exc.value)
    assert no_markers.read_text() == "# no markers\n"
    broken = json.loads(sample_results.to_json())
    del broken["arms"]["ar"]["mean_accepted"]
    (root / "benchmark" / "results.json").write_text(json.dumps(broken))
    with pytest.raises(SystemExit) as exc:
        main([str(root), "--readme", str(readme)])
    assert "`arms.ar.mean_accepted`" in str(exc.value) and "\n" not in str(exc.value)
    assert "rerun the benchmark" in str(exc.value) and readme.read_text() == README
    (root / "benchmark" / "results.json").write_text("{not json")
    with pytest.raises(SystemExit) as exc:
        main([str(root), "--readme", str(readme)])
    assert str(exc.value).startswith("error: cannot read benchmark results ")
    assert "\n" not in str(exc.value) and readme.read_text() == README
    sample_results.write(root / "benchmark" / "results.json")
    main([str(root), "--readme", str(readme)])
    assert "results table updated" in capsys.readouterr().out


def test_the_readme_has_exactly_one_pair_of_markers():
    text = (REPO / "README.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert text.index(BEGIN) < text.index(END)


def test_bootstrap_intervals_and_the_paired_speedup_are_shown_when_recorded(sample_results):
    sample_results.arms["ar"].tokens_per_s.ci95 = (390.04, 410.6)
    peftbd = sample_results.arms["peftbd"]
    peftbd.tokens_per_s.ci95 = (118.0, 127.25)
    peftbd.speedup_vs_ar = Speedup(mean=0.3049, ci95=(0.291, 0.318))
    table, caption = render(sample_results).split("\n\n")
    lines = table.splitlines()
    assert lines[2] == "| AR | 1.00 | 400.3 (390.0-410.6) | 1.00 | reference |"
    assert lines[3] == ("| PEFT-BD 1 step | 1.37 (1.32-1.41) | 122.5 (118.0-127.2) "
                        "| 0.30 (0.29-0.32) | 16/16 |")
    assert lines[4] == "| FastMTP | 1.81 (1.76-1.85) | 310.0 ± 1.0 | 0.77 | 16/16 |"  # none
    assert "95% intervals over the prompts (studentized bootstrap)" in caption
