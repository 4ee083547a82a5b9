"""Ray Train + DeepSpeed orchestration shared by `jobs.train_peftbd`, `jobs.train_mtp` and
`jobs.train_head`.

A `TorchTrainer` whose workers each call `deepspeed.initialize`, read their shard of the
artifact's train split (`ray.train.get_dataset_shard`), evaluate on the val split, and report
DeepSpeed checkpoints with `ray.train.report`. A run is `RunConfig(name=<out dir name>,
storage_path=cfg.training.storage_path or <out dir>/../ray_train)`: rerunning with the same
names resumes from its latest checkpoint (Ray Train V2 restores the run), and a lost worker
restarts the group from that checkpoint (`FailureConfig`); errors that fail the same way every
time are raised at once (`jobs.train_failures`). What is computed lives in
`peftbd.training` (no Ray there).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import tempfile
from itertools import islice
from pathlib import Path
from time import perf_counter
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
from jobs.ray_env import init_ray, shutdown
from jobs.resources import wait_for_resources
from jobs.train_failures import Trainer, raise_unhealable
from peftbd.cli import add_config_args, add_stage_args, config_from_args, output_root, run_stage_job, stage_out
from peftbd.config import Config
from peftbd.data.artifact import ArtifactError
from peftbd.layout import GENERATE, TRAIN_HEAD, TRAIN_MTP, TRAIN_PEFTBD
from peftbd.manifest import WorkerPeaks, read_manifest
from peftbd.models.loading import load_tokenizer
from peftbd.stage import StageCall, StageInputs, StageSpec
from peftbd.training.checkpoint import (
    EXPORT_DIR,
    TrainState,
    delete_run,
    load_checkpoint,
    run_location,
    save_checkpoint,
)
from peftbd.training.deepspeed_config import batch_plan, deepspeed_config, torch_extensions_dir
from peftbd.training.evaluate import evaluate, rank_rows
from peftbd.training.examples import collate_sequences, load_training_split
from peftbd.training.memory import peaks_over_ranks, step_memory
from peftbd.training.outputs import training_sections
from peftbd.training.tasks import make_task, parameter_summary
from peftbd.untrained import untrained_reasons

log = logging.getLogger(__name__)
STAGE_SPECS = {"peftbd": TRAIN_PEFTBD, "mtp": TRAIN_MTP, "head": TRAIN_HEAD}
WHAT = {"peftbd": "PEFT-BD adapter", "mtp": "FastMTP head", "head": "block-diffusion head"}
"""The stage each kind's job runs (its default --out is the stage's dir in the main job's layout)."""


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: DeepSpeed engine, resume, train/eval/checkpoint, final export."""
    import deepspeed  # here, not at the top: the driver never needs it (its import logs a warning)

    cfg: Config = config["cfg"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir(cfg.paths.cache_dir)))
    device = ray.train.torch.get_device()
    task = make_task(config["kind"], cfg)
    module = task.build(device)
    trainable = [p for p in module.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(
        model=module, model_parameters=trainable,
        config=deepspeed_config(cfg.training, task.optim, world),
    )
    plan = batch_plan(cfg.training, task.optim, world)
    dtype = str(next(engine.module.parameters()).dtype).removeprefix("torch.")  # what runs
    estimate = step_memory(config["kind"], cfg, engine.module.config,
                           *task.parameter_counts(engine.module), plan, dtype)
    if rank == 0:
        log.info("estimated peak per training step on each worker: %.0f MiB (%s)",
                 estimate.total_mib, estimate)
        if device.type == "cuda":
            card_mib = torch.cuda.get_device_properties(device).total_memory / 2**20
            if estimate.total_mib > 0.9 * card_mib:
                log.warning("the estimated step peak (%.0f MiB) is above 90%% of this GPU's %.0f MiB: "
                            "lower training.micro_batch_size or training.logits_chunk_rows",
                            estimate.total_mib, card_mib)
    state = TrainState()
    if (ckpt := ray.train.get_checkpoint()) is not None:
        with ckpt.as_directory() as ckpt_dir:
            state = load_checkpoint(engine, ckpt_dir, config["fingerprint"])
        log.info("rank %d resumed at step %d", rank, state.step)

    optim, pad_id, max_steps = task.optim, config["pad_id"], config["max_steps"]
    # max_steps 0 (asked for with training.allow_untrained): evaluate and export, no train data read
    steps_per_epoch = plan.steps_per_epoch(config["train_rows"]) if max_steps else 0
    train_shard = ray.train.get_dataset_shard("train") if max_steps else None
    val_shard = ray.train.get_dataset_shard("val")

    val_rows = [  # this worker's val rows, read once (each eval reuses them)
        rank_rows(rows, rank, world)
        for rows in val_shard.iter_batches(batch_size=plan.micro_batch * world, batch_format="numpy")
    ]
    val_batches = [collate_sequences(r, pad_id).to(device) for r in val_rows if len(r["id"])]

    def report(metrics: dict[str, Any], checkpoint: bool, final: bool) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            if checkpoint:
                save_checkpoint(engine, tmp, state, config["fingerprint"])
            if final:
                with deepspeed.zero.GatheredParameters(trainable, enabled=cfg.training.zero_stage == 3):
                    if rank == 0:
                        task.export(engine.module, Path(tmp) / EXPORT_DIR)
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp) if checkpoint else None)

    losses: list[float] = []
    train_seconds, steps_run, metrics, evaluated_at = 0.0, 0, {}, -1
    while state.step < max_steps:
        epoch, done_in_epoch = divmod(state.step, steps_per_epoch)
        micro_batches = islice(
            train_shard.iter_batches(batch_size=plan.micro_batch, batch_format="numpy", drop_last=True),
            steps_per_epoch * plan.accumulation,
        )
        for i, rows in enumerate(micro_batches):
            if i < done_in_epoch * plan.accumulation:
                continue  # consumed before the checkpoint this run resumed from
            start = perf_counter()
            loss = task.train_loss(engine.module, collate_sequences(rows, pad_id).to(device), epoch)
            engine.backward(loss)
            engine.step()
            train_seconds += perf_counter() - start
            losses.append(loss.item())
            if (i + 1) % plan.accumulation:
                continue
            state = TrainState(step=state.step + 1)
            steps_run += 1
            if rank == 0 and config.get("progress") is not None:
                config["progress"](state.step, max_steps, loss=losses[-1])
            if state.step % optim.eval_every == 0 or state.step == max_steps:
                metrics, evaluated_at = evaluate(task, engine.module, val_batches), state.step
            metrics.update(step=state.step, epoch=epoch, lr=engine.get_lr()[0],
                           train_loss=sum(losses) / len(losses))
            if state.step == max_steps:
                break
            if evaluated_at == state.step or state.step % optim.checkpoint_every == 0:
                log.info("rank %d step %d: %s", rank, state.step, metrics)
                losses.clear()
                report(dict(metrics), checkpoint=state.step % optim.checkpoint_every == 0, final=False)
                _maybe_inject_failure(config, state.step, rank)
    if evaluated_at != state.step:  # resumed from the last step's checkpoint: nothing trained
        metrics = {**evaluate(task, engine.module, val_batches), "step": state.step}
    peaks = peaks_over_ranks(WorkerPeaks.here(dtype), device)  # every rank's, so all ranks call it
    metrics.update(
        parameters=parameter_summary(*task.parameter_counts(engine.module)), steps_run=steps_run,
        train_seconds=round(train_seconds, 2), workers=peaks.to_dict(),
        memory_estimate=estimate.to_dict(),
        steps_per_second=round(steps_run / train_seconds, 3) if steps_run else None,
    )
    log.info("rank %d finished at step %d: %s", rank, state.step, metrics)
    report(metrics, checkpoint=True, final=True)


def _maybe_inject_failure(config: dict[str, Any], step: int, rank: int) -> None:
    """Fault injection for tests and drills: fail once, right after the checkpoint of a step."""
    marker = config.get("failure_marker")
    if rank == 0 and step == config.get("fail_once_at_step") and not Path(marker).exists():
        Path(marker).touch()
        raise RuntimeError(f"injected failure after the checkpoint of step {step}")


def train_call(kind: str, cfg: Config, data_dir: str | Path, out_dir: str | Path,
               resume: bool = True, fail_once_at_step: int | None = None,
               spec: StageSpec | None = None) -> StageCall:
    """The stage that trains the `kind` drafter ("peftbd", "mtp" or "head") on the artifact in
    `data_dir` into `out_dir` (spec: `peftbd.layout.TRAIN_PEFTBD` / `TRAIN_MTP` / `TRAIN_HEAD`, or
    `TRAIN_EARLY_EXIT` for the main job's early-exit step).

    `resume=True` continues the latest checkpoint of the run with these inputs; `resume=False`
    discards it first. `fail_once_at_step` injects one worker failure after that step's
    checkpoint (tests, drills).
    """
    spec = spec or STAGE_SPECS[kind]
    build = functools.partial(_train, kind=kind, cfg=cfg, data_dir=Path(data_dir).resolve(),
                              resume=resume, fail_once_at_step=fail_once_at_step)
    return StageCall(spec, cfg.to_dict(), Path(out_dir).resolve(),
                     {GENERATE.name: Path(data_dir).resolve()}, build)


def run_train(kind: str, cfg: Config, data_dir: str | Path, out_dir: str | Path,
              resume: bool = True, fail_once_at_step: int | None = None) -> Path:
    """Train the `kind` drafter on the artifact in `data_dir` and publish its weights plus
    `manifest.json` in `out_dir`, unless `out_dir` already holds the result of these inputs
    (`resume=False` always retrains). Returns `out_dir`."""
    train_call(kind, cfg, data_dir, out_dir, resume, fail_once_at_step).run(force=not resume)
    return Path(out_dir).resolve()


def _train(tmp: Path, inputs: StageInputs, kind: str, cfg: Config, data_dir: Path, resume: bool,
           fail_once_at_step: int | None) -> dict[str, Any]:
    """Run the TorchTrainer and copy the exported weights into `tmp`; the manifest sections."""
    fingerprint = inputs.fingerprint
    task = make_task(kind, cfg)
    block = cfg.drafter.block_size if kind in ("peftbd", "head") else None
    seed, world = cfg.training.seed, cfg.training.num_workers
    train, train_counts = load_training_split(data_dir, "train", block, seed,
                                              allow_empty=cfg.training.allow_untrained)
    untrained = untrained_reasons(cfg, kind, train.num_rows)  # refused unless allow_untrained
    max_steps = task.optim.max_steps if train.num_rows else 0
    val, val_counts = load_training_split(data_dir, "val", block, seed)
    plan = batch_plan(cfg.training, task.optim, world)
    if max_steps:
        plan.steps_per_epoch(train.num_rows)  # fails early when the split cannot fill one step
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
        trainer = Trainer(
            train_loop_per_worker,
            train_loop_config={
                "cfg": cfg, "kind": kind, "fingerprint": fingerprint, "train_rows": train.num_rows,
                "max_steps": max_steps,
                "pad_id": load_tokenizer(cfg).pad_token_id, "fail_once_at_step": fail_once_at_step,
                "failure_marker": str(Path(storage) / name / "injected_failure"),
                "progress": sink,
            },
            scaling_config=ScalingConfig(
                num_workers=world, use_gpu=cfg.training.use_gpu,
                resources_per_worker={"CPU": cfg.training.cpus_per_worker},
            ),
            run_config=RunConfig(
                name=name, storage_path=storage,
                failure_config=FailureConfig(max_failures=cfg.training.max_failures),
                checkpoint_config=CheckpointConfig(num_to_keep=2),
            ),
            datasets={**({"train": _dataset(train)} if max_steps else {}),
                      "val": _dataset(val.slice(0, n_eval))},
            dataset_config=DataConfig(
                datasets_to_split=["train"] if max_steps else [],
                execution_options=ExecutionOptions(preserve_order=True),  # deterministic shards
            ),
        )
        try:
            result = trainer.fit()
        except WorkerGroupError as exc:
            raise_unhealable(exc)  # not retried: fail with its own one-line message
            raise
    with result.checkpoint.as_directory() as ckpt_dir:
        shutil.copytree(Path(ckpt_dir) / EXPORT_DIR, tmp, dirs_exist_ok=True)
    log.info("trained %s drafter -> %s", kind, out_dir)
    return {
        **training_sections(kind, result.metrics, plan, train.num_rows),
        "untrained": bool(untrained), "untrained_reasons": untrained,
        "outputs": {task.export_subdir: task.export_subdir},
        "checkpoint": result.checkpoint.path,
        "ray_run": {"storage_path": storage, "name": name},
        "data": {"artifact_dir": str(data_dir), "train": train_counts.to_dict(),
                 "val": {**val_counts.to_dict(), "evaluated_rows": n_eval}},
    }


def _dataset(table: pa.Table) -> ray.data.Dataset:
    ds = ray.data.from_arrow(table)
    ds.context.enable_progress_bars = False  # two workers' bars per epoch and eval drown the log
    return ds


def main(kind: str, argv: list[str] | None = None) -> None:
    """Command line of `python -m jobs.train_<kind>`."""
    spec = STAGE_SPECS[kind]
    parser = argparse.ArgumentParser(
        prog=f"python -m jobs.train_{kind}",
        description=f"Distil the {WHAT[kind]} from "
        "the continuation artifact with Ray Train + DeepSpeed. Skipped when --out already holds "
        "the result of the same artifact, config and code.",
    )
    add_config_args(parser)
    parser.add_argument("--data", type=Path, default=None, metavar="ARTIFACT_DIR",
                        help="continuation artifact (default: <paths.out_dir>/<preset>/continuations, where "
                             "python -m jobs.generate and the main job put it)")
    add_stage_args(parser, spec)
    parser.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                        help="continue the latest checkpoint of the run with these inputs "
                             "(default); --no-resume starts over")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    data = args.data or output_root(cfg) / GENERATE.subdir
    out = stage_out(args, cfg, spec)
    run_stage_job(spec, out, lambda: train_call(kind, cfg, data, out, resume=args.resume),
                  args.force or not args.resume, args.verbose, before_exit=shutdown)
    m = read_manifest(out)
    p = m["parameters"]
    untrained = (f"; UNTRAINED: {'; '.join(m['untrained_reasons'])}"
                 if m.get("untrained") else "")
    print(f"train_{kind}: {out} ({p['trainable']:,} trainable of {p['total']:,} parameters, "
          f"eval loss {m['metrics']['eval_loss']:.4f}, target-token accuracy "
          f"{m['metrics']['eval_target_token_accuracy']:.4f}, {m['wall_seconds']} s{untrained})")
