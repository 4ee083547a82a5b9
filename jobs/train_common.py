"""Ray Train + DeepSpeed orchestration of every method's training (`jobs.train --method NAME`,
and the main job's training stages).

A `TorchTrainer` whose workers each call `deepspeed.initialize`, read their shard of the
artifact's train split (`ray.train.get_dataset_shard`), evaluate on the val split, and report
DeepSpeed checkpoints with `ray.train.report`. A run is `RunConfig(name=<out dir name>,
storage_path=cfg.training.storage_path or <out dir>/../ray_train)`: rerunning with the same
names resumes from its latest checkpoint (Ray Train V2 restores the run), and a lost worker
restarts the group from that checkpoint (`FailureConfig`); errors that fail the same way every
time are raised at once (`jobs.train_failures`). What is computed lives in
`peftbd.training` (no Ray there), the step / eval / checkpoint schedule in
`peftbd.training.schedule`.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray
import ray.train
import ray.train.torch
import torch
from ray.data import ExecutionOptions
from ray.train import (
    Checkpoint,
    CheckpointConfig,
    DataConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from ray.train.v2.api.exceptions import WorkerGroupError

from jobs.progress import relay
from jobs.ray_env import init_ray
from jobs.resources import wait_for_resources
from jobs.train_failures import Trainer, raise_unhealable
from peftbd.config import Config
from peftbd.data.artifact import ArtifactError
from peftbd.layout import GENERATE
from peftbd.manifest import WorkerPeaks
from peftbd.models.loading import load_tokenizer
from peftbd.process_setup import ready
from peftbd.stage import StageCall, StageInputs, StageSpec
from peftbd.training.checkpoint import (
    EXPORT_DIR,
    TrainState,
    delete_run,
    load_checkpoint,
    run_location,
    save_checkpoint,
)
from peftbd.training.deepspeed_config import (
    BatchPlan,
    batch_plan,
    deepspeed_config,
    torch_extensions_dir,
)
from peftbd.training.distill_task import parameter_summary
from peftbd.training.evaluate import rank_rows
from peftbd.training.examples import SequenceBatch, collate_sequences, load_training_split
from peftbd.training.length_groups import length_grouped
from peftbd.training.memory import log_step_memory, peaks_over_ranks
from peftbd.training.outputs import training_sections
from peftbd.training.recipe import TrainingRecipe
from peftbd.training.schedule import Rows, Schedule, WorkerData, train
from peftbd.training.worker_args import WorkerArgs
from peftbd.untrained import untrained_reasons

log = logging.getLogger(__name__)


def train_loop_per_worker(args: WorkerArgs) -> None:
    """One Ray Train worker: the DeepSpeed engine, resumed from Ray Train's checkpoint, trained by
    `peftbd.training.schedule.train` on this worker's shards, reported with its checkpoints, and
    the final checkpoint with the export."""
    import deepspeed  # here, not at the top: the driver never needs it (its import logs a warning)

    ready(args.cfg)  # a worker process: a plugin method's task and section, the world
    cfg = args.cfg
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir(cfg.paths.cache_dir)))
    device = ray.train.torch.get_device()
    task = args.task(cfg)
    module = task.build(device)
    trainable = [p for p in module.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(
        model=module, model_parameters=trainable,
        config=deepspeed_config(cfg.training, task.optim, world),
    )
    plan = batch_plan(cfg.training, task.optim, world)
    dtype = str(next(engine.module.parameters()).dtype).removeprefix("torch.")  # what runs
    estimate = task.step_memory(engine.module.config, *task.parameter_counts(engine.module), plan,
                                dtype)
    if rank == 0:
        log_step_memory(estimate, device)
    start = TrainState()
    if (ckpt := ray.train.get_checkpoint()) is not None:
        with ckpt.as_directory() as ckpt_dir:
            start = load_checkpoint(engine, ckpt_dir, args.fingerprint)
        log.info("rank %d resumed at step %d", rank, start.step)

    def report(state: TrainState, metrics: dict[str, Any], checkpoint: bool,
               final: bool = False) -> None:
        """`ray.train.report` with, when `checkpoint`, one of `state` (the final one: + export)."""
        with tempfile.TemporaryDirectory() as tmp:
            if checkpoint:
                save_checkpoint(engine, tmp, state, args.fingerprint)
            if final:
                with deepspeed.zero.GatheredParameters(trainable, enabled=cfg.training.zero_stage == 3):
                    if rank == 0:
                        task.export(engine.module, Path(tmp) / EXPORT_DIR)
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp) if checkpoint else None)

    def report_step(state: TrainState, metrics: dict[str, Any], checkpoint: bool) -> None:
        log.info("rank %d step %d: %s", rank, state.step, metrics)
        report(state, metrics, checkpoint)
        _maybe_inject_failure(args, state.step, rank)

    data = _worker_data(args, plan, rank, world, device)
    trained = train(engine, task, args.schedule, start, data, report_step,
                    args.progress if rank == 0 else None)
    peaks = peaks_over_ranks(WorkerPeaks.here(dtype), device)  # every rank's, so all ranks call it
    metrics = {
        **trained.metrics,
        "parameters": parameter_summary(*task.parameter_counts(engine.module)),
        "steps_run": trained.steps_run, "train_seconds": round(trained.train_seconds, 2),
        "workers": peaks.to_dict(), "memory_estimate": estimate.to_dict(),
        "steps_per_second": (round(trained.steps_run / trained.train_seconds, 3)
                             if trained.steps_run else None),
        # every eval so far, those of the runs this one resumed included (they ride in the state)
        "learning_curve": [p.to_dict() for p in trained.state.curve],
        "train_tokens": trained.state.train_tokens, "max_steps": args.schedule.max_steps,
    }
    log.info("rank %d finished at step %d: %s", rank, trained.state.step, metrics)
    report(trained.state, metrics, checkpoint=True, final=True)


def _worker_data(args: WorkerArgs, plan: BatchPlan, rank: int, world: int,
                 device: torch.device) -> WorkerData:
    """This worker's Ray Data shards as the schedule reads them: its train shard in micro-batches
    (none read when the schedule has no step) and its rows of the val split, read once."""
    def collate(rows: Rows) -> SequenceBatch:
        return collate_sequences(rows, args.pad_id).to(device)

    train_shard = ray.train.get_dataset_shard("train") if args.schedule.max_steps else None

    def train_pass() -> Iterable[Rows]:
        if train_shard is None:  # a schedule without steps: the driver passed no train split
            return ()
        return length_grouped(
            train_shard.iter_batches(batch_size=plan.micro_batch, batch_format="numpy", drop_last=True),
            args.cfg.training.length_grouping, args.cfg.training.seed)

    val_rows = [  # every worker reads the whole val split and keeps its own rows
        rank_rows(rows, rank, world) for rows in ray.train.get_dataset_shard("val").iter_batches(
            batch_size=plan.micro_batch * world, batch_format="numpy")
    ]
    return WorkerData(train_pass, collate, [collate(r) for r in val_rows if len(r["id"])])


def _maybe_inject_failure(args: WorkerArgs, step: int, rank: int) -> None:
    """Fault injection for tests and drills: fail once, right after the report of a step."""
    marker = Path(args.failure_marker)
    if rank == 0 and step == args.fail_once_at_step and not marker.exists():
        marker.touch()
        raise RuntimeError(f"injected failure after the checkpoint of step {step}")


def train_call(recipe: TrainingRecipe, cfg: Config, data_dir: str | Path, out_dir: str | Path,
               resume: bool = True, fail_once_at_step: int | None = None,
               spec: StageSpec | None = None) -> StageCall:
    """The stage that trains a method's drafter (`recipe`: `peftbd.methods.Method.recipe`) on the
    artifact in `data_dir` into `out_dir` (spec: the method's main training stage unless given,
    e.g. PEFT-BD's early-exit one).

    `resume=True` continues the latest checkpoint of the run with these inputs; `resume=False`
    discards it first. `fail_once_at_step` injects one worker failure after that step's
    checkpoint (tests, drills).
    """
    spec = spec or recipe.stage
    build = functools.partial(_train, recipe=recipe, cfg=cfg, data_dir=Path(data_dir).resolve(),
                              resume=resume, fail_once_at_step=fail_once_at_step)
    return StageCall(spec, cfg.to_dict(), Path(out_dir).resolve(),
                     {GENERATE.name: Path(data_dir).resolve()}, build)


def run_train(recipe: TrainingRecipe, cfg: Config, data_dir: str | Path, out_dir: str | Path,
              resume: bool = True, fail_once_at_step: int | None = None) -> Path:
    """Train the drafter of `recipe` on the artifact in `data_dir` and publish its weights plus
    `manifest.json` in `out_dir`, unless `out_dir` already holds the result of these inputs
    (`resume=False` always retrains). Returns `out_dir`."""
    train_call(recipe, cfg, data_dir, out_dir, resume, fail_once_at_step).run(force=not resume)
    return Path(out_dir).resolve()


def _train(tmp: Path, inputs: StageInputs, recipe: TrainingRecipe, cfg: Config, data_dir: Path, resume: bool,
           fail_once_at_step: int | None) -> dict[str, Any]:
    """Run the TorchTrainer and copy the exported weights into `tmp`; the manifest sections."""
    fingerprint = inputs.fingerprint
    task, kind = recipe.task(cfg), recipe.kind
    block = task.block_size
    seed, world = cfg.training.seed, cfg.training.num_workers
    train, train_counts = load_training_split(data_dir, "train", block, seed,
                                              allow_empty=cfg.training.allow_untrained)
    untrained = untrained_reasons(cfg, recipe.section, recipe.what, train.num_rows)  # refused unless allow_untrained
    val, val_counts = load_training_split(data_dir, "val", block, seed)
    plan = batch_plan(cfg.training, task.optim, world)
    # fails early when the split cannot fill one step; no steps (and no train data) without rows
    schedule = Schedule.of(task.optim, plan, task.optim.max_steps if train.num_rows else 0,
                           train.num_rows)
    if untrained:
        log.warning("publishing an untrained %s drafter (training.allow_untrained): %s",
                    kind, "; ".join(untrained))
    n_eval = min(val.num_rows, task.optim.eval_batches * plan.global_batch)
    if n_eval < world:
        raise ArtifactError(
            f"the val split of {data_dir} has {val.num_rows} usable rows, fewer than "
            f"training.num_workers={world}; regenerate with a larger data.val_size"
        )
    out_dir = tmp.with_name(tmp.name.removesuffix(".partial"))
    storage, name = run_location(cfg.training.storage_path, out_dir, fingerprint)
    if not resume:
        delete_run(storage, name)
    init_ray()
    wait_for_resources(f"training ({world} Ray Train workers)", [
        {"CPU": cfg.training.cpus_per_worker, "GPU": float(cfg.training.use_gpu)}] * world)
    with relay() as sink:
        args = WorkerArgs(cfg, recipe.task, fingerprint, schedule, load_tokenizer(cfg).pad_token_id,
                          progress=sink, fail_once_at_step=fail_once_at_step,
                          failure_marker=str(Path(storage) / name / "injected_failure"))
        trainer = Trainer(
            functools.partial(train_loop_per_worker, args),
            scaling_config=ScalingConfig(
                num_workers=world, use_gpu=cfg.training.use_gpu,
                resources_per_worker={"CPU": cfg.training.cpus_per_worker},
            ),
            run_config=RunConfig(
                name=name, storage_path=storage,
                failure_config=FailureConfig(max_failures=cfg.training.max_failures),
                checkpoint_config=CheckpointConfig(num_to_keep=2),
            ),
            datasets={**({"train": _dataset(train)} if schedule.max_steps else {}),
                      "val": _dataset(val.slice(0, n_eval))},
            dataset_config=DataConfig(
                datasets_to_split=["train"] if schedule.max_steps else [],
                execution_options=ExecutionOptions(preserve_order=True),  # deterministic shards
            ),
        )
        try:
            result = trainer.fit()
        except WorkerGroupError as exc:
            raise_unhealable(exc)  # not retried: fail with its own one-line message
            raise
    checkpoint, metrics = result.checkpoint, result.metrics
    if checkpoint is None or metrics is None:  # the workers' last report has both
        raise RuntimeError(f"the {kind} training run reported no checkpoint or no metrics")
    with checkpoint.as_directory() as ckpt_dir:
        shutil.copytree(Path(ckpt_dir) / EXPORT_DIR, tmp, dirs_exist_ok=True)
    log.info("trained %s drafter -> %s", kind, out_dir)
    return {
        **training_sections(kind, metrics, plan, train.num_rows),
        "untrained": bool(untrained), "untrained_reasons": untrained,
        "outputs": {task.export_subdir: task.export_subdir},
        "checkpoint": checkpoint.path,
        "ray_run": {"storage_path": storage, "name": name},
        "data": {"artifact_dir": str(data_dir), "train": train_counts.to_dict(),
                 "val": {**val_counts.to_dict(), "evaluated_rows": n_eval}},
    }


def _dataset(table: pa.Table) -> ray.data.Dataset:
    ds = ray.data.from_arrow(table)
    ds.context.enable_progress_bars = False  # two workers' bars per epoch and eval drown the log
    return ds
