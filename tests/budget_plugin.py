"""The test session's budget (`peftbd.budgets`): a session that ran the whole suite or the quick
loop records its wall time in the ledger and ends its terminal summary with it, `suite 14:02
(budget 15:00) ok` or `... SLIPPED by 0:41`; any other selection records nothing. Under
pytest-xdist only the controller records (the workers carry `workerinput`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from peftbd.budgets import QUICK_LOOP, SUITE, Budget, Check, record

NARROWING = {  # option -> its flag: set, the session runs fewer tests or may stop early
    "keyword": "-k", "deselect": "--deselect", "ignore": "--ignore", "ignore_glob": "--ignore-glob",
    "lf": "--lf", "stepwise": "--sw", "maxfail": "-x/--maxfail", "collectonly": "--collect-only",
}
ENDED = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
"""Exit statuses of a session that ran what it collected (not interrupted, no usage error)."""
_START = pytest.StashKey[float]()
_CHECK = pytest.StashKey[Check]()


@dataclass(frozen=True)
class Selection:
    """What a session was asked to run: its -m expression, the paths given (by default the
    `testpaths`), and the flags of the options that leave tests out or may stop early."""

    markexpr: str
    paths: frozenset[Path]
    default_paths: frozenset[Path]
    narrowed_by: tuple[str, ...] = ()


def classify(selection: Selection) -> Budget | None:
    """The budget a session measures: the suite (no -m), the quick loop (`-m "not slow"`), each
    over the default paths with nothing else left out; None for any other session."""
    if selection.narrowed_by or selection.paths != selection.default_paths:
        return None
    return {"": SUITE, "not slow": QUICK_LOOP}.get(" ".join(selection.markexpr.split()))


def selection_of(config: pytest.Config) -> Selection:
    """This session's selection, its paths resolved (a node id stands for its file)."""
    here = config.invocation_params.dir
    return Selection(
        markexpr=config.getoption("markexpr") or "",
        paths=frozenset((here / arg.split("::")[0]).resolve() for arg in config.args),
        default_paths=frozenset((config.rootpath / p).resolve() for p in config.getini("testpaths")),
        narrowed_by=tuple(flag for name, flag in NARROWING.items() if config.getoption(name, default=None)),
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_START] = time.perf_counter()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Record the time of a whole suite or quick loop that ran to its end (the controller only)."""
    config = session.config
    if hasattr(config, "workerinput") or exitstatus not in ENDED:
        return
    if (budget := classify(selection_of(config))) is not None:
        check = Check(budget, time.perf_counter() - config.stash[_START])
        record(check)
        config.stash[_CHECK] = check


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if (check := config.stash.get(_CHECK, None)) is not None:
        terminalreporter.write_sep("-", "budget (python3 -m peftbd.budgets: all three)")
        terminalreporter.write_line(f"{check.budget.name} {check.describe()}")
