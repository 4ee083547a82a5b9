"""The main job end to end on the tiny preset (sizes trimmed with --set to keep CI short)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRIM = [
    "data.train_size=240", "data.val_size=16", "data.test_size=16",
    "drafter.optim.max_steps=40", "mtp.optim.max_steps=40",
    "drafter.optim.eval_every=20", "drafter.optim.checkpoint_every=20",
    "mtp.optim.eval_every=20", "mtp.optim.checkpoint_every=20",
    "decoding.num_prompts=4", "decoding.repeats=1", "decoding.max_new_tokens=24",
]
STAGES = ("world", "continuations", "peftbd_adapter", "peftbd_early_exit", "mtp_head", "benchmark")


def _pipeline(out: Path) -> str:
    args = [sys.executable, "-m", "jobs.pipeline", "--out", str(out)]
    for item in TRIM:
        args += ["--set", item]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.integration
def test_main_job_runs_every_stage_then_skips_them_on_rerun(tmp_path):
    out = tmp_path / "run"
    first = _pipeline(out)
    for stage in STAGES:
        assert (out / stage / "manifest.json").is_file(), stage
        assert re.search(rf"\] .*: running -> {re.escape(str(out / stage))}", first), stage
    report = out / "benchmark" / "report.md"
    assert f"report: {report.resolve()}" in first
    text = report.read_text()
    for heading in ("Figure 1", "Table 1", "Table 2", "Table 3", "stages"):
        assert heading in text, heading
    png = next((out / "benchmark").glob("*.png"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "benchmark" / "results.json").read_text())
    audits = [arm["audit"] for arm in results["arms"].values() if arm.get("audit")]
    assert audits and all(a["exact"] == a["prompts"] for a in audits)
    manifest = json.loads((out / "manifest.json").read_text())
    assert [row["path"] for row in manifest["stages"]] == [str(out / s) for s in STAGES]
    assert all(row["wall_seconds"] is not None and row["peak_rss_mib"] for row in manifest["stages"][1:])

    again = _pipeline(out)
    assert again.count("complete, skipped") == len(STAGES)
