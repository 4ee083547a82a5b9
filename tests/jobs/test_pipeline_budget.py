"""The main job's end states its time beside its budget (peftbd.budgets): in its manifest, on the
terminal and in the ledger; a run that skipped stages is recorded but not compared."""

from __future__ import annotations

import json
import re

from peftbd.budgets import ledger_path, read_ledger
from peftbd.config import load_config

from .test_pipeline import _stand_in_outputs


def test_a_main_job_that_skipped_stages_says_so_and_is_not_compared(tmp_path, monkeypatch, capsys):
    from jobs.pipeline import main

    monkeypatch.setenv("PEFTBD_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "run"
    _stand_in_outputs(load_config("tiny"), root)  # every stage current: all skipped, no Ray
    main(["--out", str(root), "-v"])
    budget = json.loads((root / "manifest.json").read_text())["budget"]
    assert budget["seconds"] == 600 and budget["within"] is None and budget["complete_run"] is False
    assert re.search(r"finished: total \d+:\d\d \(budget 10:00; not a budget measurement\);", capsys.readouterr().out)
    entry = read_ledger(ledger_path()).entries["main job"]
    assert entry.last.complete_run is False and entry.measured is None
