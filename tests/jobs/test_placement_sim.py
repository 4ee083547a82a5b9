"""`python -m jobs.placement_sim`: the projection writes its report, figure and verdicts, every
run labelled with its cost model; with measured repeats of a placement run it replays them and
validates level by level (here the "measured" runs are the simulator's own, made on a known
cost over the preset's prompts, so the replay must come back within the tolerance)."""

from __future__ import annotations

import json

import pytest

from jobs.placement_sim import main
from peftbd.analysis.placement import one_at_a_time, summarize
from peftbd.analysis.placement_sim import SimReport
from peftbd.analysis.placement_verdict import PlacementReport
from peftbd.config import load_config
from peftbd.data.sources import first_prompts, resolve_source
from peftbd.decoding.controlled import AcceptanceProfile
from peftbd.models.loading import load_tokenizer
from peftbd.simulation.fitted_cost import FittedCost, Line
from peftbd.simulation.placements import SimMethod, SimSetup
from peftbd.simulation.study import Simulated, run_levels


def test_the_projection_writes_every_placement_and_verdict_labelled(tmp_path, capsys):
    out = tmp_path / "sim"
    main(["--hardware", "h100", "--model", "qwen3-0.6b", "--clients", "1,4", "--out", str(out)])
    report = SimReport.read(out)
    assert {f.name for f in out.iterdir()} == {"placement_sim.json", "placement_sim.md", "placement_sim.png"}
    assert [r.hardware for r in report.runs] == ["H100 x1", "H100 x2"]
    assert all(r.cost_model.startswith("roofline: H100 bf16, Qwen3-0.6B") for r in report.runs)
    assert {(r.placement, r.method, r.concurrency) for r in report.runs[0].rows} == {
        (p, m, c) for p in ("colocated", "split") for c in (1, 4)
        for m in ("peftbd [2.881/round]", "fastmtp [1.511/round]", "peftbd_head [5.3/round]")} | {
        ("split-ahead", "peftbd [2.881/round]", c) for c in (1, 4)}
    assert len(report.verdicts) == 6 and report.validation is None
    assert "SIMULATED" in capsys.readouterr().out


def test_a_missing_measured_run_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit) as err:
        main(["--measured", str(tmp_path / "nowhere"), "--hardware", "", "--out", str(tmp_path / "o")])
    assert str(err.value.code).startswith("error: --measured") and "\n" not in str(err.value.code)


def test_measured_repeats_are_replayed_and_validated_level_by_level(tmp_path, tiny_world):
    cfg = load_config("tiny")
    prompts = first_prompts(load_tokenizer(cfg), resolve_source(cfg), cfg.decoding.num_prompts,
                            cfg.serving.max_prompt_tokens)
    outputs = [20 + 3 * (i % 5) for i in range(len(prompts))]
    method = SimMethod("peftbd", "peftbd", 16, AcceptanceProfile.with_mean(2.0, 16))
    s = cfg.serving
    dirs = []
    for repeat in range(3):
        truth = FittedCost("truth", Line(4.0, 1.0), Line(6.0 + repeat * 0.2, 1.5), 0.02,
                           0.0, 0.0, 2.0)
        measured = Simulated("truth")
        for placement in ("colocated", "split"):
            setup = SimSetup(placement, truth, s.max_batch, s.batch_wait_ms, cfg.decoding.prefill_chunk,
                             groups=s.split_groups, ingress_ms=2.0)
            run_levels(measured, setup, method, prompts, outputs,
                       [(c, list(range(len(prompts)))) for c in (1, 4)])
        report = PlacementReport(
            summary=summarize(one_at_a_time(measured.records)), concurrency=measured.rows(),
            skipped={}, notes=[], devices=measured.devices, verdicts=[], outputs_identical=True,
            requests=measured.records)
        (tmp_path / f"m{repeat}").mkdir()
        report.write(tmp_path / f"m{repeat}")
        dirs += ["--measured", str(tmp_path / f"m{repeat}")]
    main(["--preset", "tiny", *dirs, "--hardware", "", "--out", str(tmp_path / "sim")])
    report = SimReport.read(tmp_path / "sim")
    assert [r.hardware for r in report.runs] == ["this box"]
    assert report.validation
    rows = [v for v in report.validation if v.metric in ("tok/s per device", "p50 ms")]
    assert {(v.placement, v.concurrency) for v in rows} == {(p, c) for p in ("colocated", "split") for c in (1, 4)}
    assert all(v.repeats == 3 and v.interval is not None for v in rows)
    assert all(v.within for v in rows), [(v.placement, v.concurrency, v.metric, v.error) for v in rows]
    assert json.loads((tmp_path / "sim" / "placement_sim.json").read_text())["validation"]
