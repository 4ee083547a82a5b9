"""The acceptance study's command on a small budget: a small world, one drafter, a deeper world
trained toward the base's held-out loss and a doubled budget, replayed per category."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from peftbd.tiny_world.corpus import CATEGORIES

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "tiny_world.train_steps=10", "tiny_world.corpus_rows=60", "data.train_size=16",
    "data.val_size=10", "data.test_size=10", "data.max_new_tokens=16", "generate.batch_size=8",
    "training.num_workers=1",  # the study's subject is what it varies, not the workers
    "fastmtp.optim.max_steps=2", "fastmtp.optim.eval_every=2", "fastmtp.optim.checkpoint_every=2",
]


def _study(out: Path, *extra: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "jobs.acceptance_study", "--out", str(out / "study"),
            "--artifacts", str(out / "base"), "--methods", "fastmtp", *extra]
    for item in SMALL:
        args += ["--set", item]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=1200)


@pytest.mark.slow
@pytest.mark.integration
def test_the_study_varies_each_factor_and_replays_every_category(tmp_path):
    proc = _study(tmp_path, "--depths", "2,4", "--budgets", "1,2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = json.loads((tmp_path / "study" / "study.json").read_text())
    names = [f["variant"]["name"] for f in study["variants"]]
    assert names == ["base", "depth4", "budget2x"]
    depth4 = study["variants"][1]
    assert depth4["layers"] == 4 and depth4["world_steps"] <= 20  # capped at 2x the base's 10
    assert study["variants"][2]["drafter_steps"] == {"train_fastmtp": 4}
    cells = {(c["variant"], c["category"]) for c in study["cells"] if c["arm"] == "fastmtp"}
    assert cells == {(n, c) for n in names for c in ("mix", *CATEGORIES)}
    assert all(c["ci95"][0] <= c["tokens_per_round"] <= c["ci95"][1] for c in study["cells"])
    text = (tmp_path / "study" / "study.md").read_text()
    assert "The deciding factor is" in text and text in proc.stdout
    assert (tmp_path / "study" / "study.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "base" / "fastmtp" / "manifest.json").is_file()  # the base is the main job's root
    again = _study(tmp_path, "--depths", "2,4", "--budgets", "1,2")
    assert again.returncode == 0 and "current" in again.stdout + again.stderr  # nothing retrained


def test_unknown_method_is_refused_by_name(capsys):
    from jobs.acceptance_study import main

    with pytest.raises(SystemExit) as exit_:
        main(["--methods", "nope"])
    assert exit_.value.code == 2 and "nope: not a registered method" in capsys.readouterr().err
