"""One writer per output: a second run refuses at once naming the holder, a dead holder's lock is
taken over, and an output whose place cannot be written fails before any work (no Ray)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from peftbd.output_lock import OutputLockError, check_writable, lock_path, output_lock
from peftbd.stage import StageSpec, run_stage, stage_inputs

REPO = Path(__file__).resolve().parents[2]
SPEC = StageSpec("demo", "demo stage", "demo", reads=())


def _hold(out: Path) -> subprocess.Popen:
    """Another process that holds `out`'s lock until killed."""
    code = ("import sys, time; from peftbd.output_lock import output_lock\n"
            f"with output_lock({str(out)!r}):\n    print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def _build_marker(built: list[str]):
    def build(tmp: Path, _inputs) -> dict:
        built.append(str(tmp))
        (tmp / "x.txt").write_text("x")
        return {}
    return build


def test_a_second_run_refuses_at_once_naming_the_holder_and_a_dead_holder_is_taken_over(
        tmp_path, caplog):
    out, built = tmp_path / "out", []
    holder = _hold(out)
    try:
        start = time.monotonic()
        with pytest.raises(OutputLockError) as err:
            run_stage(stage_inputs(SPEC, {}, {}), out, _build_marker(built), {})
        assert time.monotonic() - start < 1.0 and built == []
        message = str(err.value)
        assert message.startswith(f"{out} is being written by another run: pid {holder.pid} on "
                                  f"host {socket.gethostname()}, started 20")
        assert "ray job stop <job id>" in message and f"kill {holder.pid}" in message
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert json.loads(lock_path(out).read_text())["pid"] == holder.pid  # the dead run's record

    with caplog.at_level(logging.WARNING, logger="peftbd.output_lock"):
        run_stage(stage_inputs(SPEC, {}, {}), out, _build_marker(built), {})
    assert len(built) == 1 and (out / "x.txt").read_text() == "x"
    assert f"taking over the lock of a run that is gone (pid {holder.pid} on host" in caplog.text
    assert lock_path(out).read_text() == ""  # released cleanly: nobody holds it


def test_the_lock_is_released_when_the_build_fails_and_a_rerun_proceeds(tmp_path):
    def failing(tmp: Path, _inputs) -> dict:
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        run_stage(stage_inputs(SPEC, {}, {}), tmp_path / "out", failing, {})
    with output_lock(tmp_path / "out") as me:
        assert me.pid == os.getpid()


@pytest.mark.parametrize("make_bad", [
    lambda tmp: (tmp / "a-file").touch() or tmp / "a-file" / "out",  # its parent is a file
    lambda tmp: Path("/proc/peftbd-no-such/out"),  # a place no directory can be made
])
def test_an_unwritable_output_fails_with_one_line(tmp_path, make_bad):
    out = make_bad(tmp_path)
    with pytest.raises(OutputLockError) as err:
        check_writable(out)
    assert str(err.value).startswith(f"cannot write the output {out}: ")
    assert str(err.value).endswith("choose an --out on writable storage")
    assert "\n" not in str(err.value)
