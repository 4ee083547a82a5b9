"""Which worker runs what, and in which order, under pytest-xdist (`--dist=loadgroup`,
pyproject.toml): each test file is one group, run whole on one worker, so its module fixtures are
built once; every Serve test is in one group, so one local Serve cluster serves them all, and
so are files that share a per-process fixture (`SHARED`).

Groups are handed out longest first (the LPT rule: the long ones start while there is still short
work to fill the other worker, so no long group runs alone at the end). A group's length is the
summed time of its selected tests (so the quick loop orders by its own tests, not the files'
slow ones) in the last whole-suite run on this machine (`test_durations.json` in the cache dir,
beside the budget ledger, written by the controller at the end of such a run), else in the one
committed beside this file (a fresh machine: a run on the developers' box); a test in neither
counts one minute if `slow`, else nothing.

Nothing a group starts outlives it on its worker: when a worker's next test is in another group,
the Ray this process joined is shut down (jobs' functions call `init_ray` and leave it to the
process's exit) and whatever the group registered with `at_group_end` is stopped (the Serve
cluster), so the next group starts on a quiet machine with no stale Ray to join."""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Generator
from pathlib import Path

import pytest

from peftbd.budgets import SUITE, ledger_path
from tests.budget_plugin import ENDED, classify, selection_of

REPO = Path(__file__).resolve().parents[1]
SERVE_GROUP = "serve-cluster"
DURATIONS = "test_durations.json"
UNRECORDED_SLOW_S = 60.0
"""A slow test's guessed seconds where its group has no recorded time."""
_AT_GROUP_END: dict[str, list[Callable[[], None]]] = defaultdict(list)


def at_group_end(group: str, stop: Callable[[], None]) -> None:
    """Call `stop` once this worker has run the last test of `group` (it may run twice: also
    from its fixture's own teardown, so it must be idempotent)."""
    _AT_GROUP_END[group].append(stop)


def durations_path() -> Path:
    return ledger_path().parent / DURATIONS


SHARED = {"tests/jobs/test_generate.py": "generate-reference",
          "tests/jobs/test_generate_resume.py": "generate-reference"}
"""Files run as one group because they share a per-process fixture (tests/jobs/conftest.py's
reference generate run)."""


def group_of(path: Path) -> str:
    """The xdist group of a test file: the Serve cluster's, a SHARED group, else the file."""
    path = path.resolve()
    if not path.is_relative_to(REPO):  # a stand-in suite (the plugin's own tests)
        return str(path)
    rel = path.relative_to(REPO)
    if rel.parts[:2] == ("tests", "serve_apps"):
        return SERVE_GROUP
    return SHARED.get(rel.as_posix(), str(rel))


def recorded() -> dict[str, float]:
    """{test node id: seconds} of the last whole-suite run here, else the committed one's; empty
    if neither can be read."""
    for path in (durations_path(), Path(__file__).with_name(DURATIONS)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return {str(k): float(v) for k, v in data.items()}
    return {}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    known = recorded()
    length: dict[str, float] = defaultdict(float)
    groups = {}
    for item in items:
        groups[item] = group = group_of(item.path)
        item.add_marker(pytest.mark.xdist_group(group))
        guess = UNRECORDED_SLOW_S if item.get_closest_marker("slow") else 0.0
        length[group] += known.get(item.nodeid, guess)  # the selected tests' times, not the file's
    items.sort(key=lambda item: -length[groups[item]])  # stable: file order within a group


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    try:
        return (yield)
    finally:
        group = group_of(item.path)
        if nextitem is None or group_of(nextitem.path) != group:
            for stop in _AT_GROUP_END.pop(group, []):
                stop()
            ray = sys.modules.get("ray")
            if ray is not None and ray.is_initialized():
                ray.shutdown()


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(GroupTimes(config), "group-times")


class GroupTimes:
    """Each test's setup, call and teardown time (the controller hears every worker's reports),
    written after a whole suite that ran to its end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.spent: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.spent[report.nodeid.partition("@")[0]] += report.duration  # xdist adds "@<group>"

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(self.config, "workerinput") or exitstatus not in ENDED:
            return
        if classify(selection_of(self.config)) is not SUITE:
            return
        path = durations_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({g: round(s, 1) for g, s in sorted(self.spent.items())}, indent=1))
        tmp.replace(path)
