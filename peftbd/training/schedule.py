"""The training schedule: optimizer steps over epochs of micro-batches, evaluations and
checkpoints at fixed steps, and resume from any step, mid-epoch included.

Plain PyTorch: the engine (DeepSpeed's, or anything with its `module`, `backward`, `step` and
`get_lr`), the worker's data and what a report does (`ray.train.report` with a checkpoint in
`jobs/train_common.py`; a list in a test) come in as arguments. The data position is a function
of the step alone: a resumed run starts its epoch's pass over again and skips the micro-batches
consumed before its checkpoint, so it trains on the same batches with the same (seed, epoch)
noise as a run never interrupted.

Evaluations happen every `eval_every` steps, at the budget marks `max_steps // 4` and
`max_steps // 2` and at the last step; each adds a point to the learning curve that the state
carries (`peftbd.training.learning_curve`), with the sequence tokens trained on so far, summed
over the workers at every step that evaluates or checkpoints (the same steps on every rank).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from time import perf_counter
from typing import Any, Protocol

import torch
from torch import nn

from peftbd.config import OptimConfig
from peftbd.progress import Sink
from peftbd.training.checkpoint import TrainState
from peftbd.training.deepspeed_config import BatchPlan
from peftbd.training.distill_task import DistillTask
from peftbd.training.evaluate import evaluate, sum_over_workers
from peftbd.training.examples import SequenceBatch
from peftbd.training.learning_curve import CurvePoint, mark_steps, with_point

Rows = dict[str, Any]
"""A columnar micro-batch of artifact rows (`collate_sequences`' input)."""


class Engine(Protocol):
    """What the schedule uses of a DeepSpeed engine (`deepspeed.initialize`'s first value)."""

    module: nn.Module

    def backward(self, loss: torch.Tensor) -> Any: ...

    def step(self) -> Any: ...

    def get_lr(self) -> list[float]: ...


class Report(Protocol):
    """Publishes the metrics of `state`'s step and, when `checkpoint`, a checkpoint of `state`."""

    def __call__(self, state: TrainState, metrics: dict[str, Any], checkpoint: bool) -> None: ...


@dataclass(frozen=True)
class Schedule:
    """`max_steps` optimizer steps of `accumulation` micro-batches, `steps_per_epoch` per pass
    over the train rows; an eval every `eval_every` steps, at a quarter and a half of the budget
    (`learning_curve.mark_steps`) and at the last, a checkpoint every `checkpoint_every` steps."""

    max_steps: int
    steps_per_epoch: int
    accumulation: int
    eval_every: int
    checkpoint_every: int

    @classmethod
    def of(cls, optim: OptimConfig, plan: BatchPlan, max_steps: int, train_rows: int) -> Schedule:
        """`max_steps` steps (0: no train row is read) of `optim` and `plan` over `train_rows`."""
        return cls(max_steps, plan.steps_per_epoch(train_rows) if max_steps else 0,
                   plan.accumulation, optim.eval_every, optim.checkpoint_every)

    def evaluates(self, step: int) -> bool:
        return step % self.eval_every == 0 or step in mark_steps(self.max_steps).values()

    def checkpoints(self, step: int) -> bool:
        return step % self.checkpoint_every == 0


@dataclass(frozen=True)
class WorkerData:
    """A worker's data: `train_pass()` starts a pass over its train micro-batches (the same rows
    in the same order every time), `collate` makes one a batch on the engine's device, and
    `val_batches` are its share of the val rows."""

    train_pass: Callable[[], Iterable[Rows]]
    collate: Callable[[Rows], SequenceBatch]
    val_batches: Sequence[SequenceBatch]


@dataclass(frozen=True)
class Trained:
    """Where `train` ended: the state (its learning curve and train tokens included), the last
    step's metrics (its eval included), and the steps this call ran and their seconds."""

    state: TrainState
    metrics: dict[str, Any]
    steps_run: int
    train_seconds: float


def train(engine: Engine, task: DistillTask, schedule: Schedule, state: TrainState,
          data: WorkerData, report: Report, progress: Sink | None = None) -> Trained:
    """Train `task` from `state` to `schedule.max_steps`. After each step `progress` gets the
    step and its last micro-batch's loss; steps that evaluate or checkpoint are reported (but
    the last, which the caller reports with what it adds) with the mean train loss since the
    previous report and the train tokens so far. Each evaluation adds a learning-curve point to
    the state. A run that has no step left evaluates once (its point replaces the last one of
    the same step)."""
    losses: list[float] = []
    metrics: dict[str, Any] = {}
    steps_run, train_seconds, evaluated_at = 0, 0.0, -1
    pending_tokens = 0  # this worker's since the last sum over the workers
    while state.step < schedule.max_steps:
        epoch, done_in_epoch = divmod(state.step, schedule.steps_per_epoch)
        micro_batches = islice(data.train_pass(), schedule.steps_per_epoch * schedule.accumulation)
        for i, rows in enumerate(micro_batches):
            if i < done_in_epoch * schedule.accumulation:
                continue  # consumed before the checkpoint this run resumed from
            start = perf_counter()
            batch = data.collate(rows)
            loss = task.train_loss(engine.module, batch, epoch)
            engine.backward(loss)
            engine.step()
            train_seconds += perf_counter() - start
            losses.append(loss.item())
            pending_tokens += int(batch.lengths.sum())
            if (i + 1) % schedule.accumulation:
                continue
            step = state.step + 1
            steps_run += 1
            if progress is not None:
                progress(step, schedule.max_steps, loss=losses[-1])
            evaluates, checkpoints = schedule.evaluates(step), schedule.checkpoints(step)
            train_tokens = state.train_tokens
            if evaluates or checkpoints:  # the same steps on every rank: a collective is safe
                train_tokens += _summed(pending_tokens, engine.module)
                pending_tokens = 0
            curve = state.curve
            if evaluates:
                metrics, evaluated_at = evaluate(task, engine.module, data.val_batches), step
                curve = with_point(curve, CurvePoint.of(step, schedule.max_steps, train_tokens,
                                                        metrics))
            state = TrainState(step=step, train_tokens=train_tokens, curve=curve)
            metrics.update(step=step, epoch=epoch, lr=engine.get_lr()[0],
                           train_loss=sum(losses) / len(losses), train_tokens=train_tokens)
            if step == schedule.max_steps:
                break
            if evaluates or checkpoints:
                losses.clear()
                report(state, dict(metrics), checkpoint=checkpoints)
    if evaluated_at != state.step:  # resumed from the last step's checkpoint: nothing trained
        metrics = {**evaluate(task, engine.module, data.val_batches), "step": state.step,
                   "train_tokens": state.train_tokens}
        state = TrainState(state.step, state.train_tokens, with_point(state.curve, CurvePoint.of(
            state.step, schedule.max_steps, state.train_tokens, metrics)))
    return Trained(state, metrics, steps_run, train_seconds)


def _summed(tokens: int, module: nn.Module) -> int:
    """`tokens` summed over the workers (`evaluate.sum_over_workers`)."""
    total = {"train_tokens": torch.tensor(float(tokens), dtype=torch.float64)}
    return int(sum_over_workers(total, next(module.parameters()).device)["train_tokens"])
