"""What a training job's driver hands each of its workers (`jobs/train_common.py`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from peftbd.config import Config
from peftbd.progress import Sink
from peftbd.training.distill_task import DistillTask
from peftbd.training.schedule import Schedule


@dataclass(frozen=True)
class WorkerArgs:
    """One training run's worker arguments.

    `fingerprint`: the stage inputs' (a checkpoint written for others is refused); `pad_id`: the
    tokenizer's; `progress`: where rank 0 reports its steps (None: nobody listens);
    `fail_once_at_step`: fault injection (tests, drills): rank 0 fails once after that step's
    report, unless `failure_marker` (a file it creates then) exists.
    """

    cfg: Config
    task: Callable[[Config], DistillTask]  # the method's (sent whole: a worker needs no registry)
    fingerprint: str
    schedule: Schedule
    pad_id: int
    progress: Sink | None = None
    fail_once_at_step: int | None = None
    failure_marker: str = ""
