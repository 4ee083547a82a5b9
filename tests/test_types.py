"""The type checker (mypy, the dev extra; settings in pyproject.toml [tool.mypy]) passes on the
packages whose types are kept. Its cache (.mypy_cache/) makes a rerun take seconds; a cold run
~15 s."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHECKED = ("peftbd", "serve_apps", "jobs")
"""Every package: the library, the Serve apps and the Ray jobs, whose messages across processes
are the library's typed ones (round events, replica stats, placement.json:
`peftbd.serving.rounds`, `peftbd.serving.messages`, `peftbd.analysis.placement_verdict`)."""


def test_the_checked_packages_type_check_clean() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed: bash scripts/install.sh installs the dev extra")
    run = subprocess.run([sys.executable, "-m", "mypy", *CHECKED], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
