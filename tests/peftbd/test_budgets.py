"""The budgets' ledger and lines (peftbd.budgets): a slip is reported, never raised, and a main
job that skipped stages or changed settings is recorded but not compared."""

from __future__ import annotations

import socket

import pytest

from peftbd.budgets import (
    MAIN_JOB, QUICK_LOOP, SUITE, Check, Ledger, clock, ledger_path, main, main_job_check, read_ledger,
    record, report,
)
from peftbd.config import load_config


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test its own ledger, never the developer's."""
    monkeypatch.setenv("PEFTBD_CACHE", str(tmp_path / "cache"))


def test_the_ledger_round_trips(tmp_path):
    path = record(Check(SUITE, 842.04))
    assert path == tmp_path / "cache" / "budgets.json"
    ledger = read_ledger(path)
    assert Ledger.model_validate_json(ledger.model_dump_json()) == ledger
    run = ledger.entries["suite"].measured
    assert run is not None and run == ledger.entries["suite"].last
    assert (run.seconds, run.complete_run, run.host) == (842.04, True, socket.gethostname())
    assert run.cpus >= 1 and run.date.tzinfo is not None
    assert set(ledger.entries) == {"suite"}  # the other budgets untouched


def test_a_slip_is_reported_not_raised():
    assert Check(MAIN_JOB, 581.2).describe() == "9:41 (budget 10:00) ok"
    slipped = Check(MAIN_JOB, 641)
    assert slipped.within is False and slipped.describe() == "10:41 (budget 10:00) SLIPPED by 0:41"
    record(slipped)
    line = report()[0]
    assert line.startswith("main job   10:41 (budget 10:00) SLIPPED by 0:41, measured ")
    assert line.endswith(f" on {socket.gethostname()}")


def test_a_partial_main_job_is_recorded_but_not_compared():
    partial = Check(MAIN_JOB, 42.0, complete_run=False)
    assert partial.within is None and partial.describe() == "0:42 (budget 10:00; not a budget measurement)"
    assert partial.manifest_section() == {"seconds": 600, "measured": 42.0, "within": None, "complete_run": False}
    record(partial)
    assert report()[0].startswith("main job   not measured on this machine (the last run, ")
    assert report()[0].endswith("was no budget measurement; run: python3 -m jobs.pipeline --from world)")
    record(Check(MAIN_JOB, 590.0))
    record(partial)  # a later rerun that skipped stages keeps the measurement
    entry = read_ledger(ledger_path()).entries["main job"]
    assert entry.last.complete_run is False and entry.measured is not None and entry.measured.seconds == 590.0
    assert report()[0].startswith("main job   9:50 (budget 10:00) ok, measured ")


def test_only_the_default_main_job_with_every_stage_run_is_a_measurement():
    tiny = load_config("tiny")
    assert main_job_check(tiny, 500.0, [True] * 8).complete_run
    assert not main_job_check(tiny, 40.0, [False] + [True] * 7).complete_run  # the world was cached
    assert not main_job_check(load_config("tiny", overrides=["peftbd.lora_r=4"]), 500.0, [True] * 8).complete_run


def test_unmeasured_budgets_say_how_to_measure_them(capsys):
    main([])
    assert capsys.readouterr().out.splitlines() == [
        "main job   not measured on this machine (run: python3 -m jobs.pipeline --from world)",
        "suite      not measured on this machine (run: python3 -m pytest)",
        'quick loop not measured on this machine (run: python3 -m pytest -m "not slow")',
    ]
    assert QUICK_LOOP.seconds == 180 and SUITE.seconds == 900 and MAIN_JOB.seconds == 600


def test_an_unreadable_ledger_is_said_then_replaced():
    path = ledger_path()
    path.parent.mkdir(parents=True)
    path.write_text('{"entries": {"suite": 1}}')
    lines = report()
    assert lines[0].startswith(f"{path} is no budget ledger (") and len(lines) == 4
    record(Check(QUICK_LOOP, 200.0))
    assert report()[2].startswith("quick loop 3:20 (budget 3:00) SLIPPED by 0:20, measured ")


def test_clock():
    assert [clock(s) for s in (0, 59.6, 581.2, 3700)] == ["0:00", "1:00", "9:41", "1:01:40"]
