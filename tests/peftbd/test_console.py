"""The console: the job's own lines on the terminal, everything else in the stage's log file."""

from __future__ import annotations

import logging
import os
import sys

from peftbd import progress
from peftbd.console import Console


def test_quiet_console_sends_library_output_to_the_stage_log(tmp_path, capfd):
    with Console(tmp_path / "logs") as console:
        console.line("[job] starting")
        with console.stage("train", "train things"):
            print("a library print")
            os.write(2, b"a C-level write to stderr\n")
            logging.getLogger("somelib").warning("a library warning")
            for step in range(1, 4):
                progress.report(step, 3, loss=0.5)
        print("a late line after the stages")
        console.line("[job] done")
    sys.stdout.flush()
    out = capfd.readouterr()
    assert out.out.splitlines() == ["[job] starting", "  train things: 3/3 (loss=0.5)", "[job] done"]
    assert out.err == ""
    log = (tmp_path / "logs" / "train.log").read_text()
    assert "a library print" in log and "C-level" in log and "a library warning" in log
    assert "a late line after the stages" in (tmp_path / "logs" / "job.log").read_text()
    print("after the console")
    assert capfd.readouterr().out == "after the console\n"  # the terminal is restored


def test_verbose_console_leaves_output_on_the_terminal(tmp_path, capfd):
    with Console(tmp_path / "logs", verbose=True) as console:
        with console.stage("train", "train things"):
            print("a library print")
        console.line("[job] done")
    assert "a library print" in capfd.readouterr().out
    assert console.log_path("train") is None and not (tmp_path / "logs" / "train.log").exists()


def test_before_exit_runs_while_output_still_goes_to_the_log(tmp_path, capfd):
    with Console(tmp_path / "logs", before_exit=lambda: print("shutting down")):
        pass
    assert "shutting down" not in capfd.readouterr().out
    assert "shutting down" in (tmp_path / "logs" / "job.log").read_text()


def test_a_note_is_a_line_on_the_terminal_at_once_and_leaves_the_count_alone(tmp_path, capfd):
    with Console(tmp_path / "logs") as console:
        with console.stage("generate", "generate"):
            progress.report(0, 1, note="waiting up to 300 s for Ray resources: ...")
            progress.report(2, 4)
    sys.stdout.flush()
    assert capfd.readouterr().out.splitlines() == [
        "  generate: waiting up to 300 s for Ray resources: ...", "  generate: 2/4"]


def test_a_tally_counts_items_finished_on_other_threads_for_the_listener_that_made_it():
    from concurrent.futures import ThreadPoolExecutor

    seen: list = []
    with progress.listening(lambda done, total, **info: seen.append((done, total, info))):
        tally = progress.Tally(40)
    with ThreadPoolExecutor(8) as pool:  # outside the block: the tally keeps its listener
        list(pool.map(lambda i: tally.tick(item=i), range(40)))
    tally.note("a level done")
    assert sorted(d for d, _, info in seen if "note" not in info) == list(range(1, 41))
    assert seen[-1] == (40, 40, {"note": "a level done"})
    progress.Tally(3).tick()  # nobody listening: nothing happens


def test_without_a_terminal_a_long_stage_says_its_count_every_so_often(tmp_path, capfd, monkeypatch):
    """`ray job logs` and CI have no terminal: a count line at most every PIPE_EVERY_S seconds
    (here every report), never for the last count twice."""
    monkeypatch.setattr("peftbd.console.PIPE_EVERY_S", 0.0)
    with Console(tmp_path / "logs") as console:
        with console.stage("train", "train"):
            for step in range(1, 4):
                progress.report(step, 3)
    sys.stdout.flush()
    assert capfd.readouterr().out.splitlines() == ["  train: 1/3", "  train: 2/3", "  train: 3/3"]
