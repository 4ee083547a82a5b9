"""One writer per output: an exclusive lock beside an output directory, and the check that the
output's place is writable, both before any work starts.

The lock is `<out>.job.lock`, held with `flock` for as long as the run lives: the kernel drops it
when the holder exits or is killed, so a lock left by a dead process is simply taken over (its
holder record is still in the file and is logged). While held, the file names the holder (pid,
host, start time, command), which a second run's refusal repeats.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from peftbd.errors import UserError

log = logging.getLogger(__name__)

SUFFIX = ".job.lock"


class OutputLockError(UserError, RuntimeError):
    """The output is held by another live run, or its place is not writable; the message says
    who holds it or what failed, and how to proceed."""


@dataclass(frozen=True)
class Holder:
    """The run that holds an output's lock."""

    pid: int
    host: str
    started: str  # UTC, ISO 8601
    command: str

    @classmethod
    def me(cls) -> Holder:
        return cls(os.getpid(), socket.gethostname(),
                   datetime.now(timezone.utc).isoformat(timespec="seconds"), " ".join(sys.argv))

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, started {self.started} ({self.command})"


def lock_path(out_dir: str | Path) -> Path:
    """The lock file of `out_dir`: a sibling, so it outlives the output's atomic replacement."""
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + SUFFIX)


def check_writable(out_dir: str | Path) -> None:
    """Create `out_dir`'s parent if needed and write a probe file there; fails with one line."""
    parent = Path(out_dir).absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".write-probe-"):
            pass
    except OSError as exc:
        where = exc.filename or parent
        why = f"{where} is not a directory" if Path(where).is_file() else f"{exc.strerror or exc} ({where})"
        raise OutputLockError(
            f"cannot write the output {out_dir}: {why}; choose an --out on writable storage"
        ) from exc


@contextlib.contextmanager
def output_lock(out_dir: str | Path) -> Iterator[Holder]:
    """Hold `out_dir`'s lock for the block; raises `OutputLockError` at once when a live run
    holds it (naming that run) or when its place is not writable."""
    check_writable(out_dir)
    path = lock_path(out_dir)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            who = holder.describe() if holder else "a process that is just starting"
            stop = f"kill {holder.pid} on {holder.host}" if holder else "stop it"
            raise OutputLockError(
                f"{out_dir} is being written by another run: {who}. Wait for it to finish, or "
                f"stop it ({stop}; a submitted job: ray job stop <job id>) and rerun: this run "
                f"resumes its work"
            ) from None
        stale = _read_holder(fd)
        if stale:
            log.warning("%s: taking over the lock of a run that is gone (%s)", out_dir, stale.describe())
        me = Holder.me()
        _write_holder(fd, json.dumps(dataclasses.asdict(me)))
        try:
            yield me
        finally:
            _write_holder(fd, "")  # released cleanly: no holder to report
    finally:
        os.close(fd)  # closing drops the flock


def _read_holder(fd: int) -> Holder | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 65536).decode(errors="replace")
    try:
        return Holder(**json.loads(text)) if text.strip() else None
    except (ValueError, TypeError):
        return None


def _write_holder(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
    os.fsync(fd)
