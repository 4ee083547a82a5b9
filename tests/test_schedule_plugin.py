"""The xdist schedule plugin: what a group starts is stopped when its worker moves on."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

GROUP_A = """
from pathlib import Path
from tests.schedule_plugin import at_group_end, group_of

STOPPED = Path(__file__).with_name("stopped")


def test_registers():
    at_group_end(group_of(Path(__file__)), lambda: STOPPED.write_text("stopped"))


def test_still_running_within_its_group():
    assert not STOPPED.exists()
"""
GROUP_B = """
from pathlib import Path


def test_stopped_before_the_next_group():
    assert Path(__file__).with_name("stopped").read_text() == "stopped"
"""


def test_a_group_s_stop_runs_after_its_last_test_and_before_the_next_group(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    monkeypatch.setenv("PEFTBD_CACHE", str(pytester.path / "cache"))
    pytester.makeini("[pytest]\ntestpaths = suite\n")
    pytester.mkdir("suite")
    pytester.makepyfile(**{"suite/test_a": GROUP_A, "suite/test_b": GROUP_B})
    result = pytester.runpytest_subprocess("-p", "tests.schedule_plugin", "-n", "0")
    result.assert_outcomes(passed=3)
