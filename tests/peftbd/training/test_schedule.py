"""The training schedule without Ray (`peftbd.training.schedule.train`) on DeepSpeed engines in the
test process: a PEFT-BD run interrupted right after a mid-epoch checkpoint and resumed from it ends
with the weights, step losses, reports, metrics and learning curve of a run never interrupted, bit
for bit; the schedule evaluates at a quarter, a half and all of its budget."""

from __future__ import annotations

from pathlib import Path

import torch

from peftbd.config import Config, load_config
from peftbd.models.loading import load_tokenizer
from peftbd.training.checkpoint import TrainState, load_checkpoint, save_checkpoint
from peftbd.training.deepspeed_config import batch_plan
from peftbd.training.examples import collate_sequences
from peftbd.training.schedule import Rows, Schedule, Trained, WorkerData, train
from peftbd.methods import method

TRAIN_ROWS = 6
"""One rank, one row per micro-batch, two per step: three steps per epoch."""
OPTIM = {"global_batch_size": 2, "max_steps": 7, "eval_every": 3, "checkpoint_every": 4}
STOP_AT = 4
"""The interrupted run stops after this step's checkpoint: step 1 of epoch 1, so the resumed run
skips that epoch's first two micro-batches, then crosses into epoch 2."""


class Stopped(Exception):
    """The interruption (a worker lost after its checkpoint)."""


def _rows(n: int, seed: int) -> list[Rows]:
    """`n` one-row micro-batches of random tokens: an 8-token prompt and a 24-token reply."""
    tokens = torch.randint(100, 1900, (n, 32), generator=torch.Generator().manual_seed(seed))
    return [{"id": [f"{seed}-{i}"], "prompt_ids": [row[:8]], "continuation_ids": [row[8:]],
             "prompt_len": [8]} for i, row in enumerate(tokens.tolist())]


def _run(ds_engine, cfg: Config, ckpt_dir: Path, resume: bool = False,
         stop_at: int | None = None) -> tuple[Trained | None, dict, list, dict]:
    """A run from scratch or from the checkpoint in `ckpt_dir`: what `train` returned (None when
    stopped), the loss of each step, the reports and the trainable weights it ended with."""
    task = method("peftbd").task(cfg)
    engine = ds_engine(task.build(torch.device("cpu")), cfg, task.optim)
    start = load_checkpoint(engine, ckpt_dir, "fp") if resume else TrainState()
    pad_id = load_tokenizer(cfg).pad_token_id
    train_rows, val_rows = _rows(TRAIN_ROWS, seed=0), _rows(1, seed=1)
    data = WorkerData(lambda: iter(train_rows), lambda rows: collate_sequences(rows, pad_id),
                      [collate_sequences(val_rows[0], pad_id)])
    schedule = Schedule.of(task.optim, batch_plan(cfg.training, task.optim, 1), OPTIM["max_steps"],
                           TRAIN_ROWS)
    assert schedule.steps_per_epoch == 3 and schedule.accumulation == 2
    losses, reports = {}, []

    def report(state: TrainState, metrics: dict, checkpoint: bool) -> None:
        reports.append((state.step, metrics, checkpoint))
        if checkpoint:
            save_checkpoint(engine, ckpt_dir, state, "fp")
        if state.step == stop_at:
            raise Stopped

    def progress(done: int, total: int, loss: float) -> None:
        losses[done] = loss

    try:
        trained = train(engine, task, schedule, start, data, report, progress)
    except Stopped:
        trained = None
    weights = {n: p.detach().clone() for n, p in engine.module.named_parameters() if p.requires_grad}
    return trained, losses, reports, weights


def test_a_run_resumed_mid_epoch_ends_as_one_never_interrupted(ds_engine, tiny_world, tmp_path):
    cfg = load_config("tiny", overrides=[
        "training.micro_batch_size=1", *(f"peftbd.optim.{k}={v}" for k, v in OPTIM.items())])
    straight, straight_losses, straight_reports, straight_weights = _run(
        ds_engine, cfg, tmp_path / "straight")
    stopped, first_losses, first_reports, _ = _run(ds_engine, cfg, tmp_path / "run", stop_at=STOP_AT)
    resumed, rest_losses, rest_reports, resumed_weights = _run(
        ds_engine, cfg, tmp_path / "run", resume=True)

    assert stopped is None and straight is not None and resumed is not None
    # evals at 1 (a quarter of 7), 3 (half, and eval_every), 6; a checkpoint at 4; 7 is the caller's
    assert [r[0] for r in straight_reports] == [1, 3, 4, 6]
    assert [r[1]["epoch"] for r in straight_reports] == [0, 0, 1, 1]
    assert (straight.steps_run, resumed.steps_run, resumed.state.step) == (7, 3, 7)
    # the learning curve survives the interruption: the resumed state is the straight run's
    assert resumed.state == straight.state
    curve = straight.state.curve
    assert [p.step for p in curve] == [1, 3, 6, 7]
    assert [p.fraction for p in curve] == [1 / 7, 3 / 7, 6 / 7, 1.0]
    assert [p.train_tokens for p in curve] == [64 * p.step for p in curve]  # 2 rows of 32 a step
    assert [r[1]["train_tokens"] for r in straight_reports] == [64, 192, 256, 384]
    assert curve[-1].accepted_prefix_mean == straight.metrics["eval_accepted_prefix_mean"]
    assert all(p.ci95 is None for p in curve)  # one val row: no interval
    # the budget marks (1, 3, 7) keep the val row's values, through the checkpoint as well
    assert [len(p.rows) for p in curve] == [1, 1, 0, 1]
    assert sorted(first_losses) == [1, 2, 3, 4] and sorted(rest_losses) == [5, 6, 7]
    assert torch.equal(torch.tensor([straight_losses[s] for s in range(1, 8)]),
                       torch.tensor([{**first_losses, **rest_losses}[s] for s in range(1, 8)]))
    assert first_reports + rest_reports == straight_reports
    assert resumed.metrics == straight.metrics
    assert resumed.metrics["step"] == 7 and "eval_loss" in resumed.metrics
    assert resumed_weights.keys() == straight_weights.keys()
    assert all(torch.equal(resumed_weights[n], w) for n, w in straight_weights.items())


def test_the_schedule_evaluates_at_a_quarter_a_half_and_all_of_its_budget():
    def evals(max_steps: int, eval_every: int) -> list[int]:
        schedule = Schedule(max_steps, steps_per_epoch=5, accumulation=1, eval_every=eval_every,
                            checkpoint_every=1000)
        return [s for s in range(1, max_steps + 1) if schedule.evaluates(s)]

    assert evals(100, 1000) == [25, 50, 100]
    assert evals(100, 40) == [25, 40, 50, 80, 100]
    assert evals(7, 1000) == [1, 3, 7]
    assert evals(3, 1000) == [1, 3]  # a quarter of 3 rounds to step 0: no eval there
    assert evals(1, 1000) == [1]
