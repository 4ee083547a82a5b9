"""The time budgets (the main job, the suite, the quick loop) and this machine's last measurement
of each.

The main job (`jobs.pipeline`) and a test session that ran the whole suite or the quick loop
(tests/budget_plugin.py) record their wall time in a ledger, `budgets.json` in the cache dir
(`PEFTBD_CACHE`, else the tiny preset's `paths.cache_dir`). A slip is reported, never raised:
timings are noisy on a shared machine. A main job that skipped a stage, or ran other settings
than the default ones, is no budget measurement: it is recorded as such and not compared.

    python3 -m peftbd.budgets     # one line per budget: measured time, budget, ok / SLIPPED
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock
from pydantic import BaseModel, ConfigDict

from peftbd.config import Config, cache_root, load_config
from peftbd.presets import PRESETS

LEDGER = "budgets.json"
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Budget:
    """The most `command` may take on this machine, in seconds."""

    name: str
    seconds: int
    command: str


MAIN_JOB = Budget("main job", 600, "python3 -m jobs.pipeline")
SUITE = Budget("suite", 900, "python3 -m pytest")
QUICK_LOOP = Budget("quick loop", 180, 'python3 -m pytest -m "not slow"')
BUDGETS = (MAIN_JOB, SUITE, QUICK_LOOP)
COMPLETE_MAIN_JOB = "python3 -m jobs.pipeline --from world"
"""A main job that reruns every stage, the world's copy or build included (as from an empty cache)."""


class Measurement(BaseModel):
    """One timed run: how long, whether it counts against its budget, when and where."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seconds: float
    complete_run: bool  # False: a main job that skipped stages or ran other settings
    date: datetime
    host: str
    cpus: int
    commit: str | None  # this checkout's git commit; None outside a git checkout

    @classmethod
    def now(cls, seconds: float, complete_run: bool = True) -> Measurement:
        """A run of `seconds` that ended now, on this machine."""
        return cls(seconds=seconds, complete_run=complete_run,
                   date=datetime.now(timezone.utc), host=socket.gethostname(),
                   cpus=os.cpu_count() or 1, commit=_commit())


class Entry(BaseModel):
    """A budget's last run, and its last run that was a measurement (they differ after a main
    job that skipped stages)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    last: Measurement
    measured: Measurement | None


class Ledger(BaseModel):
    """Each budget's entry, by the budget's name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entries: dict[str, Entry] = {}

    def with_run(self, budget: Budget, run: Measurement) -> Ledger:
        """This ledger with `run` as `budget`'s last run (and its measurement if complete)."""
        before = self.entries.get(budget.name)
        measured = run if run.complete_run else before.measured if before else None
        return Ledger(entries={**self.entries, budget.name: Entry(last=run, measured=measured)})


@dataclass(frozen=True)
class Check:
    """A run's time against its budget; only a complete run is compared."""

    budget: Budget
    seconds: float
    complete_run: bool = True

    @property
    def within(self) -> bool | None:
        """Whether the run kept its budget; None: no budget measurement, not compared."""
        return round(self.seconds) <= self.budget.seconds if self.complete_run else None

    def describe(self) -> str:
        """`9:41 (budget 10:00) ok`, `10:41 (budget 10:00) SLIPPED by 0:41`, or, not compared,
        `0:42 (budget 10:00; not a budget measurement)`."""
        head = f"{clock(self.seconds)} (budget {clock(self.budget.seconds)}"
        if self.within is None:
            return f"{head}; not a budget measurement)"
        return f"{head}) " + ("ok" if self.within else f"SLIPPED by {clock(self.seconds - self.budget.seconds)}")

    def manifest_section(self) -> dict[str, float | bool | None]:
        """The main job manifest's `budget`: the budget's and the measured seconds, `within`,
        `complete_run`."""
        return {"seconds": self.budget.seconds, "measured": self.seconds, "within": self.within,
                "complete_run": self.complete_run}


def clock(seconds: float) -> str:
    """Seconds as m:ss (h:mm:ss from an hour): 581.2 -> '9:41'."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def ledger_path(cache_dir: str | None = None) -> Path:
    """The ledger in the cache dir: `PEFTBD_CACHE`, else `cache_dir`, else the tiny preset's."""
    return cache_root(cache_dir or PRESETS["tiny"]["paths"]["cache_dir"]) / LEDGER


def read_ledger(path: Path) -> Ledger:
    """The ledger at `path`, empty where there is none; a file that is no ledger (another
    peftbd's format, an edit) raises ValueError."""
    return Ledger.model_validate_json(path.read_text()) if path.is_file() else Ledger()


def main_job_check(cfg: Config, seconds: float, stages_ran: Sequence[bool]) -> Check:
    """The main job's time against its budget: a budget measurement only with the default
    settings (the tiny preset, no --config or --set) and every stage run, the world's included
    (as from an empty cache)."""
    return Check(MAIN_JOB, seconds, cfg == load_config("tiny") and all(stages_ran))


def record(check: Check, cache_dir: str | None = None) -> Path:
    """Write `check`'s run, ended now on this machine, as its budget's last run in the ledger
    (atomically, one writer at a time); a ledger that cannot be read is replaced (it holds only
    the last timings). The ledger's path."""
    path = ledger_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    run = Measurement.now(check.seconds, check.complete_run)
    with FileLock(f"{path}.lock"):
        try:
            ledger = read_ledger(path)
        except ValueError:
            ledger = Ledger()
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(ledger.with_run(check.budget, run).model_dump_json(indent=2))
        tmp.replace(path)
    return path


def budget_line(budget: Budget, entry: Entry | None) -> str:
    """`main job   9:41 (budget 10:00) ok, measured <date> on <host>`, or how to measure it."""
    if entry is not None and entry.measured is not None:
        m = entry.measured
        text = f"{Check(budget, m.seconds).describe()}, measured {m.date:%Y-%m-%d} on {m.host}"
    else:
        last = "" if entry is None else f"the last run, {entry.last.date:%Y-%m-%d}, was no budget measurement; "
        command = COMPLETE_MAIN_JOB if budget is MAIN_JOB else budget.command
        text = f"not measured on this machine ({last}run: {command})"
    return f"{budget.name:<10} {text}"


def report() -> list[str]:
    """One line per budget; a ledger that cannot be read is said first, its budgets unmeasured."""
    path = ledger_path()
    try:
        ledger, lines = read_ledger(path), []
    except ValueError as exc:
        first = str(exc).splitlines()[0]
        ledger, lines = Ledger(), [f"{path} is no budget ledger ({first}); the next measurement replaces it"]
    return lines + [budget_line(b, ledger.entries.get(b.name)) for b in BUDGETS]


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def main(argv: Sequence[str] | None = None) -> None:
    argparse.ArgumentParser(prog="python3 -m peftbd.budgets", description=__doc__.split("\n\n")[0]).parse_args(argv)
    print("\n".join(report()))


if __name__ == "__main__":
    main()
