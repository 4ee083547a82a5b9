"""The main job's stages, declared once: name, output subdirectory under the output root
(`<paths.out_dir>/<preset>` by default), the config they read, the upstream stages they consume
and the code that decides their output. The pipeline, the stage jobs' defaults, their skip
decisions (`peftbd.stage`) and the report's stage table all read them from here."""

from __future__ import annotations

from peftbd.stage import StageSpec

_PLACEMENT_ONLY = ("training.storage_path", "training.max_failures")
"""Training keys that say where checkpoints go and how often to retry, not what is trained."""

WORLD = StageSpec(
    "world", "tiny world", "world", reads=("tiny_world",),
    code=("peftbd.tiny_world.build", "peftbd.tiny_world.tokenizer", "peftbd.tiny_world.verifier",
          "peftbd.tiny_world.corpus", "peftbd.data.chat"),
    command="python -m jobs.pipeline",
)
GENERATE = StageSpec(
    "generate", "generate continuations", "continuations", reads=("model", "data"),
    inputs=(WORLD,), code=("peftbd.data", "peftbd.models.loading", "jobs.generate"),
    command="python -m jobs.generate",
)
_TRAIN_CODE = ("peftbd.training", "peftbd.models", "peftbd.data.artifact", "jobs.train_common")
TRAIN_PEFTBD = StageSpec(
    "train_peftbd", "train PEFT-BD adapter", "peftbd_adapter",
    reads=("model", "drafter", "training", "data.max_new_tokens"),  # the offline rounds' budget
    ignores=("drafter.early_exit_layers", *_PLACEMENT_ONLY),
    inputs=(GENERATE,), code=_TRAIN_CODE, command="python -m jobs.train_peftbd",
)
TRAIN_EARLY_EXIT = StageSpec(
    "train_early_exit", "train early-exit PEFT-BD adapter", "peftbd_early_exit",
    reads=TRAIN_PEFTBD.reads, ignores=TRAIN_PEFTBD.ignores, inputs=TRAIN_PEFTBD.inputs,
    code=_TRAIN_CODE, job=TRAIN_PEFTBD.name,
    command="python -m jobs.train_peftbd --set drafter.draft_layers=<drafter.early_exit_layers>",
)
TRAIN_MTP = StageSpec(
    "train_mtp", "train FastMTP head", "mtp_head", reads=("model", "mtp", "training"),
    ignores=_PLACEMENT_ONLY, inputs=(GENERATE,), code=_TRAIN_CODE, command="python -m jobs.train_mtp",
)
BENCHMARK = StageSpec(
    "benchmark", "benchmark + report", "benchmark",
    reads=("preset", "model", "decoding", "data.max_prompt_len", "drafter.block_size",
           "drafter.early_exit_layers", "mtp.num_steps"),
    inputs=(GENERATE, TRAIN_PEFTBD, TRAIN_EARLY_EXIT, TRAIN_MTP),
    code=("peftbd.decoding", "peftbd.benchmarking", "peftbd.analysis", "peftbd.models",
          "jobs.benchmark"),
    command="python -m jobs.benchmark",
)

STAGES: tuple[StageSpec, ...] = (WORLD, GENERATE, TRAIN_PEFTBD, TRAIN_EARLY_EXIT, TRAIN_MTP, BENCHMARK)
"""The main job's stages in run order."""
BY_NAME = {s.name: s for s in STAGES}

ENGINE_SPEED = StageSpec(
    "engine_speed", "engine speed check", "engine_speed",
    reads=("model", "tiny_world", "data.source", "data.max_prompt_len", "decoding", "drafter",
           "training.seed"),
    code=("peftbd.decoding", "peftbd.models", "peftbd.cost_model", "peftbd.data.sources",
          "peftbd.benchmarking.engine_speed"),
    command="python -m peftbd.benchmarking.engine_speed",
)
PLACEMENT = StageSpec(
    "placement", "placement experiment", "placement",
    reads=("preset", "model", "tiny_world", "data.source", "drafter", "mtp", "serving", "decoding"),
    inputs=(TRAIN_PEFTBD, TRAIN_MTP),
    code=("peftbd.serving", "peftbd.decoding", "peftbd.models", "peftbd.analysis.placement",
          "serve_apps", "jobs.placement"),
    command="python -m jobs.placement",
)
"""Experiments outside the main job, under the same contract (rerun only when their inputs change)."""
