"""What a job shows a person: its own lines and one progress bar per long stage on the terminal,
everything else (library logs, Ray's worker output, warnings) in per-stage log files.

Quiet (the default) works at the file-descriptor level: stdout and stderr (fds 1 and 2) point at
the current log file, so whatever any library or Ray's log forwarding prints lands there, also
lines that arrive late; the console writes to a copy of the original stdout. `verbose=True`
leaves everything on the terminal, as without a console.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from peftbd.progress import listening

LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"
PIPE_EVERY_S = 30.0
"""Seconds between a stage's count lines where no terminal shows a bar (`ray job logs`)."""


class Console:
    """The terminal of one job run; `log_dir` receives `<name>.log` per stage. `before_exit`
    runs while output still goes to the logs (e.g. `ray.shutdown`, so worker lines that arrive
    late land there, not after the job's summary)."""

    def __init__(self, log_dir: str | Path, verbose: bool = False,
                 before_exit: Callable[[], None] | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.verbose = verbose
        self.before_exit = before_exit
        self._terminal: TextIO = sys.stdout
        self._saved: tuple[int, int] | None = None  # the original fds 1 and 2 (quiet only)
        self._streams: tuple[TextIO, TextIO] = (sys.stdout, sys.stderr)

    def __enter__(self) -> Console:
        if not self.verbose:
            sys.stdout.flush()
            sys.stderr.flush()
            self._saved = (os.dup(1), os.dup(2))
            self._streams = (sys.stdout, sys.stderr)
            self._terminal = os.fdopen(os.dup(self._saved[0]), "w", buffering=1)
            self._point_at(self.log_dir / "job.log")
            # Python-level writes go through fds 1 and 2 too, whoever replaced sys.stdout before.
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
        root = logging.getLogger()
        self._level, self._handler = root.level, logging.StreamHandler(sys.stderr)
        self._handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(self._handler)
        root.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.before_exit is not None:
            self.before_exit()
        root = logging.getLogger()
        root.removeHandler(self._handler)
        root.setLevel(self._level)
        if self._saved is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = self._streams
        for fd, saved in zip((1, 2), self._saved):
            os.dup2(saved, fd)
            os.close(saved)
        self._saved = None
        self._terminal.close()
        self._terminal = sys.stdout

    def _point_at(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def line(self, text: str) -> None:
        """A line of the job's own, always on the terminal."""
        print(text, file=self._terminal, flush=True)

    def log_path(self, name: str) -> Path | None:
        """Where stage `name`'s library output goes (None when verbose: the terminal)."""
        return None if self.verbose else self.log_dir / f"{name}.log"

    @contextlib.contextmanager
    def stage(self, name: str, title: str) -> Iterator[None]:
        """Inside: output goes to `<log_dir>/<name>.log` (quiet) and progress reports drive a
        bar titled `title` on the terminal."""
        path = self.log_path(name)
        if path is not None:
            self._point_at(path)
        # A live bar on a terminal; elsewhere (a pipe, `ray job logs`, CI) a count line at most
        # every PIPE_EVERY_S seconds, and one with the final count.
        live = self._terminal.isatty()
        bars: list[tqdm] = []  # made on the first report, when the total is known
        last: dict[str, Any] = {}
        said = [time.monotonic()]

        def count_line() -> str:
            info = ", ".join(f"{k}={v}" for k, v in last["info"].items())
            return f"  {title}: {last['done']}/{last['total']}" + (f" ({info})" if info else "")

        def update(done: int, total: int, **info: Any) -> None:
            if "note" in info:  # a line to say now (e.g. what the stage waits for), not a count
                self.line(f"  {title}: {info['note']}")
                return
            shown = {k: f"{v:.3g}" if isinstance(v, float) else v for k, v in info.items()}
            last.update(done=done, total=total, info=shown)
            if not live:
                if time.monotonic() - said[0] >= PIPE_EVERY_S and done < total:
                    said[0] = time.monotonic()
                    self.line(count_line())
                return
            if not bars:
                bars.append(tqdm(desc=f"  {title}", total=total, file=self._terminal,
                                 dynamic_ncols=True, mininterval=0.5))
            bars[0].total, bars[0].n = total, done
            bars[0].set_postfix(shown, refresh=False)
            bars[0].refresh()

        try:
            with listening(update):
                yield
        finally:
            for bar in bars:
                bar.close()
            if last and not live:
                self.line(count_line())
            if path is not None:
                self._point_at(self.log_dir / "job.log")
