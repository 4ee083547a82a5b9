"""The budget plugin (tests/budget_plugin.py) tells the whole suite and the quick loop from any
other session, which it never records."""

from __future__ import annotations

from pathlib import Path

import pytest

from peftbd.budgets import QUICK_LOOP, SUITE, ledger_path, read_ledger

from .budget_plugin import Selection, classify, selection_of

pytest_plugins = ["pytester"]

TESTS = frozenset({Path("/repo/tests")})


@pytest.mark.parametrize(("markexpr", "paths", "narrowed_by", "budget"), [
    ("", TESTS, (), SUITE),
    ("not slow", TESTS, (), QUICK_LOOP),
    ("  not   slow ", TESTS, (), QUICK_LOOP),
    ("slow", TESTS, (), None),
    ("not slow and not e2e", TESTS, (), None),
    ("", frozenset({Path("/repo/tests/peftbd")}), (), None),
    ("not slow", frozenset({Path("/repo/tests/test_types.py")}), (), None),
    ("", TESTS, ("-k",), None),
    ("not slow", TESTS, ("--lf",), None),
    ("", TESTS, ("-x/--maxfail",), None),
])
def test_a_session_is_the_suite_the_quick_loop_or_neither(markexpr, paths, narrowed_by, budget):
    assert classify(Selection(markexpr, paths, TESTS, narrowed_by)) is budget


@pytest.mark.parametrize(("args", "budget"), [
    ((), SUITE),
    (("-m", "not slow"), QUICK_LOOP),
    (("tests",), SUITE),
    (("tests/test_a.py::test_one",), None),
    (("-m", "not slow", "-k", "one"), None),
    (("--deselect", "tests/test_a.py::test_one"), None),
    (("--ignore", "tests/sub"), None),
    (("--ignore-glob", "*_a.py"), None),
    (("--lf",), None),
    (("--sw",), None),
    (("-x",), None),
    (("--co",), None),
])
def test_the_selection_is_read_from_pytest_options(pytester, args, budget):
    """The option names the plugin reads are pytest's: each narrowing flag is seen."""
    pytester.makeini("[pytest]\ntestpaths = tests\n")
    pytester.mkdir("tests")
    assert classify(selection_of(pytester.parseconfig(*args))) is budget


RECORDS_PIDS = """
import os
import tests.budget_plugin as plugin

def _record(check, _real=plugin.record):
    with open(os.environ["RECORDS"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    return _real(check)

plugin.record = _record
"""
"""A stand-in suite's conftest: each process that records writes its pid to $RECORDS."""


def test_a_whole_session_under_xdist_is_recorded_once_and_says_its_budget(pytester, monkeypatch):
    """A stand-in suite (its own testpaths) through the plugin with an xdist worker: the
    controller alone records, and the terminal summary says the time beside the budget."""
    repo = Path(__file__).resolve().parents[1]
    records = pytester.path / "records"
    monkeypatch.setenv("PYTHONPATH", str(repo))
    monkeypatch.setenv("PEFTBD_CACHE", str(pytester.path / "cache"))
    monkeypatch.setenv("RECORDS", str(records))
    pytester.makeini("[pytest]\ntestpaths = suite\n")
    pytester.mkdir("suite")
    pytester.makepyfile(**{"suite/conftest": RECORDS_PIDS, "suite/test_one": "def test_one():\n    pass\n"})
    result = pytester.runpytest_subprocess("-p", "tests.budget_plugin", "-n", "1")
    result.assert_outcomes(passed=1)
    result.stdout.re_match_lines([r"suite 0:0\d \(budget 15:00\) ok"])
    assert len(records.read_text().split()) == 1
    assert set(read_ledger(ledger_path()).entries) == {"suite"}
