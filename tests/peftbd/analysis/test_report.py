"""The report is a pure function of results.json and the stage manifests; Figure 1 is a real PNG."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from peftbd.analysis.report import (
    FIGURE_1,
    FIGURE_2,
    build_report,
    read_stage_manifests,
    summary_lines,
)
from peftbd.analysis.tables import markdown_table
from peftbd.benchmarking.schema import DrafterInfo, Replay, Speedup, Throughput, stat
from peftbd.manifest import write_manifest


STAGE_DIRS = {"generate": "continuations", "train_peftbd": "peftbd",
              "train_peftbd_early_exit": "peftbd_early_exit", "train_fastmtp": "fastmtp"}


def _stage_manifests(root: Path) -> dict[str, Path]:
    """Stage manifests under `root`; returns the benchmark's inputs ({stage name: dir})."""
    for sub, wall in zip(STAGE_DIRS.values(), (41.5, 87.25, 60.75, 63.0)):
        (root / sub).mkdir(parents=True)
        write_manifest(root / sub, {"wall_seconds": wall, "peak_rss_mib": 812.0,
                                    "peak_gpu_mib": None})
    return {name: root / sub for name, sub in reversed(STAGE_DIRS.items())}  # order given: none


def test_report_has_every_table_and_numbers_from_the_artifacts(tmp_path: Path, sample_results) -> None:
    manifests = read_stage_manifests(_stage_manifests(tmp_path / "artifacts"))
    assert list(manifests) == ["generate continuations", "train PEFT-BD adapter",
                               "train early-exit PEFT-BD adapter", "train FastMTP head"]
    text = build_report(sample_results, manifests, tmp_path / "out").read_text()
    for heading in ("Findings", "Figure 1", "Figure 2", "Table 1", "Table 2", "Table 3", "Table 4",
                    "Table 5", "The paper beside ours", "Pipeline stages", "Per-category acceptance"):
        assert heading in text
    assert "| 123.2 | 121.8 | 122.5 | 122.5 ± 0.8 | 122.5 |" in text  # runs, mean ± std, mean
    # Table 1: per round first (FastMTP: 3 calls of 0.4 ms + overhead = 1.3 ms), per call beside
    assert "| PEFT-BD 1 step | 1.08 | 2.70 | 2.50 | 420 | 2.61 | 420 | 2.50 | 1.04 |" in text
    assert "| FastMTP | 0.52 | 1.30 | 2.50 | 300 | 0.40 | 300 | 2.50 | 0.16 |" in text
    assert "| AR | n/a | n/a | 2.50 | 0 | n/a | 768 | 2.50 | n/a |" in text
    # Table 4: rate (accepted / proposed) per position, FastMTP's 3 positions, PEFT-BD's 4
    assert "| PEFT-BD 1 step | 0.60 (60/100) | 0.30 (30/100) | 0.12 (12/100) | 0.04 (4/100) |" in text
    assert "| FastMTP | 0.70 (70/100) | 0.45 (45/100) | 0.25 (25/100) |  |" in text
    # Table 5: gamma^j at 0.9, fitted gamma = 106 accepted / 202 reached, conditional rates
    assert "| PEFT-BD 1 step | gamma^j, training gamma = 0.9 | 0.900 | 0.810 | 0.729 | 0.656 |" in text
    assert "fitted gamma = 0.525 | 0.525 | 0.275 | 0.144 | 0.076 |" in text
    assert "| PEFT-BD 1 step | measured P(accept j \\| accepted j-1) (model: gamma) | 0.600 | 0.500 | 0.400 | 0.333 |" in text
    assert "FastMTP | gamma" not in text  # the gamma table is PEFT-BD's only
    assert "- **(a)** A longer accepted prefix" in text and "**Not measurable here.**" in text
    assert "87.2" in text and "41.5" in text  # stage wall times
    assert "| train early-exit PEFT-BD adapter | 60.8 |" in text
    assert "34.05 ± 0.2" in text  # the paper's column, labelled
    assert "SGLang" in text and "test CPU" in text


def test_changing_an_artifact_changes_the_report(tmp_path: Path, sample_results) -> None:
    inputs = _stage_manifests(tmp_path / "artifacts")
    results = sample_results
    before = build_report(results, read_stage_manifests(inputs),
                          tmp_path / "a").read_text()

    changed = copy.deepcopy(results)
    changed.arms["fastmtp"].tokens_per_s = Throughput(**stat([777.0, 779.0]).model_dump())
    audit = changed.arms["peftbd"].audit
    assert audit is not None
    audit.exact, audit.exact_pct = 15, 93.75
    after = build_report(changed, read_stage_manifests(inputs),
                         tmp_path / "b").read_text()
    assert "778.0 ± 1.4" in after and "778.0" not in before
    assert "93.8% (15/16)" in after and "93.8%" not in before

    m = json.loads((tmp_path / "artifacts/fastmtp/manifest.json").read_text())
    write_manifest(tmp_path / "artifacts/fastmtp", {**m, "wall_seconds": 1234.5})
    again = build_report(results, read_stage_manifests(inputs),
                         tmp_path / "c").read_text()
    assert "1234.5" in again and "1234.5" not in before
    assert build_report(results, read_stage_manifests(inputs),
                        tmp_path / "d").read_text() == again  # deterministic


@pytest.mark.parametrize("name", [FIGURE_1, FIGURE_2])
def test_figures_are_valid_pngs(tmp_path: Path, sample_results, name) -> None:
    build_report(sample_results, {}, tmp_path)
    png = tmp_path / name
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = mpimg.imread(png)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
    assert image[..., :3].std() > 0.01  # not a blank canvas


def test_summary_lines_one_per_arm(sample_results) -> None:
    lines = summary_lines(sample_results)
    assert len(lines) == 3
    assert lines[0] == "AR: 400.3 ± 1.0 tok/s, 1.00 accepted/round"
    assert lines[1] == ("PEFT-BD 1 step: 122.5 ± 0.8 tok/s, 1.37 accepted/round, audit 16/16 "
                        "exact, draft/verify 1.08 per round (1.04 per call)")
    assert lines[2].endswith("draft/verify 0.52 per round (0.16 per call)")


@pytest.mark.parametrize("value, cell", [(None, "n/a"), ("a|b", "a\\|b"), (3, "3")])
def test_markdown_table_cells(value, cell) -> None:
    assert markdown_table(["x"], [[value]]).splitlines()[2] == f"| {cell} |"


def test_offline_estimates_sit_beside_the_engine_and_short_runs_are_flagged(tmp_path, sample_results) -> None:
    results = copy.deepcopy(sample_results)
    engine = results.arms["peftbd"].mean_accepted_prefix
    assert engine is not None

    def replay(prefix: float) -> Replay:
        return Replay(rounds=100, proposed=400, accepted=round(100 * prefix),
                      mean_accepted_prefix=prefix, token_acceptance=None)

    results.arms["peftbd"].replay = replay(engine / 1.25)
    results.arms["fastmtp"].replay = replay(0.0)
    results.drafters = {
        "peftbd": DrafterInfo(path="/a/peftbd",
                                      metrics={"eval_accepted_prefix_mean": engine / 1.5}),
        "fastmtp": DrafterInfo(path="/a/fastmtp", metrics={"eval_accepted_prefix_mean": 0.4})}
    text = build_report(results, {}, tmp_path).read_text()
    assert (f"| PEFT-BD 1 step | {engine:.2f} | {engine / 1.25:.2f} | +25% | no | "
            f"{engine / 1.5:.2f} | -17% |") in text
    fastmtp = results.arms["fastmtp"].mean_accepted_prefix
    # no ratio to a zero replay
    assert f"| FastMTP | {fastmtp:.2f} | 0.00 | n/a | n/a | 0.40 | n/a |" in text
    shortest = min(r.decode_s for arm in results.arms.values() for r in arm.repeats)
    if shortest >= 3:
        assert "Every run timed at least" in text
    results.arms["ar"].repeats[0].decode_s = 0.5
    text = build_report(results, {}, tmp_path / "short").read_text()
    assert "**Too short to time reliably:**" in text and "AR (0.50 s)" in text


def test_drafters_published_untrained_on_purpose_are_named(tmp_path, sample_results) -> None:
    results = copy.deepcopy(sample_results)
    assert "Untrained drafters" not in build_report(results, {}, tmp_path).read_text()
    results.drafters = {
        "peftbd": DrafterInfo(path="/a/peftbd"),
        "fastmtp": DrafterInfo(path="/a/fastmtp", untrained=True,
                                untrained_reasons=["fastmtp.optim.max_steps=0 (no optimizer step)"])}
    text = build_report(results, {}, tmp_path / "untrained").read_text()
    assert ("**Untrained drafters** (published on purpose, training.allow_untrained): `fastmtp` "
            "(fastmtp.optim.max_steps=0 (no optimizer step)); their acceptance is not a trained "
            "drafter's.") in text
    assert "`peftbd_adapter`" not in text


def test_cost_at_scale_table_projects_with_this_run_s_acceptance(tmp_path, sample_results,
                                                                 cost_profile_of) -> None:
    text = build_report(sample_results, {}, tmp_path / "none").read_text()
    assert "## Table 7: cost at the paper's architecture" in text and "Not profiled" in text

    results = copy.deepcopy(sample_results)
    arms = {a: (0.0, 100.0) if a == "ar" else (100.0, 100.0) for a in results.arms}
    results.cost_at_scale = cost_profile_of(arms)
    text = build_report(results, {}, tmp_path / "profiled").read_text()
    table = text.split("## Table 7", 1)[1].split("\n## ", 1)[0]
    assert "cost at scale x acceptance from tiny" in table and "Qwen/Qwen3-0.6B" in table
    accepted = results.arms["peftbd"].mean_accepted.mean
    # draft = verify = AR step: PEFT-BD's projected speedup is its accepted tokens over 2 steps
    row = next(line for line in table.splitlines()
               if line.startswith(f"| {results.arms['peftbd'].label} |"))
    assert f"| {accepted / 2:.2f} |" in row and "100.0 / 100.0 (1.00)" in row
    assert "(float32 on cpu, every forward eager)" in table and "FELL BACK" not in table


def test_the_cost_section_says_loudly_which_profiled_arm_ran_without_cuda_graphs(
        tmp_path, sample_results, cost_profile_of) -> None:
    results = copy.deepcopy(sample_results)
    results.cost_at_scale = cost_profile_of({"ar": (0.0, 10.0), "peftbd": (10.0, 10.0)})
    for arm in results.cost_at_scale.timed_arms().values():  # compiled on CUDA, under auto
        arm.device, arm.paths, arm.cuda_graph_replays, arm.cuda_graph_skips = (
            "cuda:0", {"verify": "compiled"}, 8, 0)
    results.cost_at_scale.profiles["float32"].arms["peftbd"].cuda_graph_skips = 2
    text = build_report(results, {}, tmp_path).read_text()
    table = text.split("## Table 7", 1)[1].split("\n## ", 1)[0]
    assert "(float32 on cuda:0, every forward compiled)" in table
    assert ("**CUDA GRAPHS FELL BACK in float32 peftbd (8 replays, 2 skips): those arms' compiled "
            "forwards ran without CUDA graphs, so their times are not the fast path's "
            "(decoding.fast_path=true makes this an error)**.") in table


def test_stage_table_shows_the_workers_peaks_and_dtype_beside_the_drivers():
    from peftbd.analysis.tables import stage_table

    table = stage_table({
        "generate continuations": {"wall_seconds": 10.0, "peak_rss_mib": 550.0, "workers": {
            "workers": 2, "peak_rss_mib": 4100.0, "peak_gpu_mib": 9000.0, "dtype": "bfloat16"}},
        "benchmark": {"wall_seconds": 5.0, "peak_rss_mib": 5000.0, "driver_peak_rss_mib": 530.0,
                      "workers": {"workers": 1, "peak_rss_mib": 5000.0, "peak_gpu_mib": None,
                                  "dtype": "float32"}},
        "tiny world": {"wall_seconds": 400.0, "peak_rss_mib": 900.0},
    })
    lines = table.splitlines()
    assert "driver peak RSS MiB | worker peak RSS MiB | worker peak GPU MiB | dtype" in lines[0]
    assert lines[2] == "| generate continuations | 10.0 | 550 | 4100 | 9000 | bfloat16 |"
    assert lines[3] == "| benchmark | 5.0 | 530 | 5000 | n/a | float32 |"
    assert lines[4] == "| tiny world | 400.0 | 900 | n/a | n/a | n/a |"


def test_summary_lines_give_the_interval_and_speedup_when_measured(sample_results) -> None:
    results = copy.deepcopy(sample_results)
    arms = results.arms
    arms["ar"].tokens_per_s.ci95 = (390.0, 410.5)
    arms["peftbd"].tokens_per_s.ci95 = (118.0, 127.25)
    arms["peftbd"].speedup_vs_ar = Speedup(mean=0.306, ci95=(0.29, 0.32))
    lines = summary_lines(results)
    assert lines[0] == "AR: 400.3 tok/s (95% interval 390.0-410.5), 1.00 accepted/round"
    assert lines[1].startswith("PEFT-BD 1 step: 122.5 tok/s (95% interval 118.0-127.2), 0.31x AR, "
                               "1.37 accepted/round")


def test_the_report_summarises_a_placement_experiment_beside_the_run():
    from peftbd.analysis.report import placement_section
    from peftbd.layout import placement_stage

    assert placement_section({}) == []
    lines = placement_section({placement_stage().title: {
        "placements": ["colocated", "split"], "outputs_identical": True,
        "verdicts": ["**peftbd, split:** drafting costs 1.00 ms per generated token split"]}})
    assert lines[0].startswith("## Placement") and "colocated, split" in lines[1]
    assert "**peftbd, split:**" in lines[2]
    assert "no verdict" in placement_section({placement_stage().title: {"placements": ["colocated"]}})[2]


def test_the_report_shows_the_simulated_placement_when_it_sits_beside_the_experiment(
        tmp_path: Path) -> None:
    from peftbd.analysis.placement import Devices, LoadRow
    from peftbd.analysis.placement_sim import SimReport, SimulatedRun, sim_verdicts
    from peftbd.analysis.placement_sim_summary import beside_lines
    from peftbd.analysis.report import placement_section
    from peftbd.layout import placement_stage

    manifests = {placement_stage().title: {"placements": ["colocated", "split"],
                                           "outputs_identical": True, "verdicts": ["v"]}}
    placement, page = tmp_path / "placement", tmp_path / "benchmark"
    absent = beside_lines(placement, page)
    assert absent == [] and placement_section(manifests, absent) == placement_section(manifests)

    def row(p: str, clients: int, tps: float, busy: dict[str, float | None]) -> LoadRow:
        return LoadRow(placement=p, method="peftbd", concurrency=clients, requests=clients,
                       requests_per_s=None, tokens_per_s=None, tokens_per_s_per_device=tps,
                       client_tokens_per_s=10.0, p50_ms=100.0, p95_ms=100.0,
                       transport_ms_per_token=None, mean_batch=None, busy=busy)

    rows = [row("colocated", c, 10.0 * c, {"engine": 0.9}) for c in (1, 4)]
    rows += [row("split", c, 8.0 * c, {"drafter": 0.5, "verifier": 0.9}) for c in (1, 4)]
    run = SimulatedRun("H100 x2", "Qwen3-8B", "roofline-h100", rows,
                       {"colocated": Devices(2, 2), "split": Devices(2, 1)})
    (tmp_path / "placement_sim").mkdir()
    SimReport(runs=[run], verdicts=sim_verdicts(run, 0.5)).write(tmp_path / "placement_sim")
    lines = placement_section(manifests, beside_lines(placement, page))
    assert lines[:3] == placement_section(manifests)  # the measured verdict first, unchanged
    [simulated] = lines[3:]  # one paragraph: the simulated section's first screen
    assert simulated.startswith("## Simulated placement (SIMULATED)")
    assert "cost models: [a] roofline-h100" in simulated
    table = [line for line in simulated.splitlines() if line.startswith("|")]
    assert table[0] == "| SIMULATED: hardware · model [cost model] | peftbd |"
    assert table[2].startswith("| H100 x2 · Qwen3-8B [a] | never <= 4; best 0.80x at 1; ")
    assert "(../placement_sim/placement_sim.md)" in simulated  # the details, from report.md
    assert "### Details" not in simulated


def test_the_timing_line_says_each_forward_path_and_where_compiling_fell(tmp_path: Path,
                                                                         sample_results) -> None:
    results = sample_results
    for arm in results.arms.values():
        arm.paths = {"verify": "eager"}
    text = build_report(results, {}, tmp_path / "eager").read_text()
    assert "Forward paths: every forward eager (like for like)." in text and "Compiling" not in text
    for arm_id, arm in results.arms.items():
        arm.paths, arm.compile_s = {"verify": "compiled"}, 20.25
        arm.timed_compiles = 2 if arm_id == "peftbd" else 0
    text = build_report(results, {}, tmp_path / "fast").read_text()
    assert ("Forward paths: every forward compiled (like for like). Compiling took 61 s over the "
            "workers, in untimed warm-ups that run every timed pass once; 2 inside timed passes "
            "(peftbd: 2; their tok/s include compiling).") in text
