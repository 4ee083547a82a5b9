import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_help_lists_presets_and_options():
    out = subprocess.run(
        [sys.executable, "-m", "jobs.pipeline", "--help"], cwd=REPO, capture_output=True,
        text=True, check=True,
    ).stdout
    for text in ("tiny", "qwen3-0.6b", "--preset", "--config", "--set", "--out"):
        assert text in out


def test_bad_override_exits_with_the_key_named():
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.pipeline", "--set", "drafter.blok_size=8"], cwd=REPO,
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "drafter.blok_size" in proc.stderr and "drafter.block_size" in proc.stderr
