"""The main job's stages, declared once: name, output subdirectory under the output root
(`<paths.out_dir>/<preset>` by default), the config they read, the upstream stages they consume
and the code that decides their output. The pipeline, the stage jobs' defaults, their skip
decisions (`peftbd.stage`) and the report's stage table all read them from here."""

from __future__ import annotations

from peftbd.config_sections import BlockOffsets
from peftbd.stage import StageSpec

_PLACEMENT_ONLY = ("training.storage_path", "training.max_failures", "training.allow_untrained")
"""Training keys that say where checkpoints go, how often to retry and what may be published,
not what is trained (allow_untrained only lets settings through that change the fingerprint)."""

WORLD = StageSpec(
    "world", "tiny world", "world", reads=("tiny_world",),
    ignores=("tiny_world.shipped",),  # where the world comes from, not what it is
    code=("peftbd.tiny_world.build", "peftbd.tiny_world.tokenizer", "peftbd.tiny_world.verifier",
          "peftbd.tiny_world.corpus", "peftbd.tiny_world.documents", "peftbd.tiny_world.formulaic",
          "peftbd.tiny_world.grounded", "peftbd.data.chat"),
    command="python -m jobs.pipeline",
)
_GREEDY_ENGINE = ("peftbd.decoding.loop", "peftbd.decoding.verify", "peftbd.decoding.ragged",
                  "peftbd.decoding.cache_adapter", "peftbd.decoding.state", "peftbd.decoding.drafter",
                  "peftbd.decoding.metrics", "peftbd.decoding.clock", "peftbd.decoding.fast_path",
                  "peftbd.decoding.sampling", "peftbd.models.early_exit")
"""The engine's greedy AR, which decodes generate's continuations (its drafters do not)."""
GENERATE = StageSpec(
    "generate", "generate continuations", "continuations", reads=("model", "data"),
    ignores=("data.source",),  # where the prompts lie: their content is in extra["source"]
    inputs=(WORLD,), code=("peftbd.data", "peftbd.models.loading", "peftbd.models.sources",
                           "peftbd.models.architecture", "jobs.generate", *_GREEDY_ENGINE),
    command="python -m jobs.generate",
)
_TRAIN_CODE = ("peftbd.training", "peftbd.models", "peftbd.data.artifact", "jobs.train_common")
TRAIN_PEFTBD = StageSpec(
    "train_peftbd", "train PEFT-BD adapter", "peftbd_adapter",
    reads=("model", "drafter", "training", "data.max_new_tokens"),  # the offline rounds' budget
    ignores=("drafter.early_exit_layers", "drafter.offsets_ablation", *_PLACEMENT_ONLY),
    inputs=(GENERATE,), code=_TRAIN_CODE, command="python -m jobs.train_peftbd",
)
TRAIN_EARLY_EXIT = StageSpec(
    "train_early_exit", "train early-exit PEFT-BD adapter", "peftbd_early_exit",
    reads=TRAIN_PEFTBD.reads, ignores=TRAIN_PEFTBD.ignores, inputs=TRAIN_PEFTBD.inputs,
    code=_TRAIN_CODE, job=TRAIN_PEFTBD.name,
    command="python -m jobs.train_peftbd --set drafter.draft_layers=<drafter.early_exit_layers>",
)
TRAIN_OFFSETS = StageSpec(
    "train_offsets", "train PEFT-BD adapter, other block offsets", "peftbd_offsets",
    reads=TRAIN_PEFTBD.reads, ignores=TRAIN_PEFTBD.ignores, inputs=TRAIN_PEFTBD.inputs,
    code=_TRAIN_CODE, job=TRAIN_PEFTBD.name,
    command="python -m jobs.train_peftbd --set drafter.block_offsets=<the other of random|aligned>",
)
"""The block-offsets ablation (`drafter.offsets_ablation`): the adapter trained with the other
recipe, e.g. aligned (BD3LM, the paper) beside random (the offsets the engine drafts from)."""
TRAIN_MTP = StageSpec(
    "train_mtp", "train FastMTP head", "mtp_head", reads=("model", "mtp", "training"),
    ignores=_PLACEMENT_ONLY, inputs=(GENERATE,), code=_TRAIN_CODE, command="python -m jobs.train_mtp",
)
TRAIN_HEAD = StageSpec(
    "train_head", "train block-diffusion head", "bd_head",
    reads=("model", "head", "drafter.block_size", "training", "data.max_new_tokens"),
    ignores=("head.draft_vocab", *_PLACEMENT_ONLY),  # the benchmark picks the draft vocabulary
    inputs=(GENERATE,), code=_TRAIN_CODE, command="python -m jobs.train_head",
)
"""The block-diffusion head (DFlash-style, `peftbd.models.bd_head`) on the frozen verifier."""
TRAIN_DFLASH = StageSpec(
    "train_dflash", "train DFlash head", "dflash_head",
    reads=("model", "dflash", "drafter.block_size", "training", "data.max_new_tokens"),
    ignores=("dflash.draft_vocab", *_PLACEMENT_ONLY),
    inputs=(GENERATE,), code=_TRAIN_CODE, command="python -m jobs.train_dflash",
)
"""The same head trained with DFlash's published recipe (`dflash`: its feature layers, block,
loss weights and anchors; `peftbd.methods.dflash`)."""
COST_PROFILE = StageSpec(
    "cost_profile", "cost profile at the paper's architecture", "cost_profile",
    reads=("cost_profile", "model.attn_implementation", "drafter.block_size",
           "drafter.target_modules", "drafter.offsets_ablation", "mtp.num_steps", "head.layers",
           "head.intermediate_size", "head.feature_rule", "head.block_masks",
           "dflash.intermediate_size", "dflash.feature_rule", "dflash.block_masks",
           "training.seed", "decoding.synthetic",
           "decoding.synthetic_seed"),
    code=("peftbd.benchmarking.cost_profile", "peftbd.benchmarking.cost_profile_models",
          "peftbd.benchmarking.cost_profile_schema", "peftbd.benchmarking.misfit",
          "peftbd.benchmarking.forward_counter", "peftbd.benchmarking.roofline",
          "peftbd.benchmarking.device_floor", "peftbd.benchmarking.shape_decode",
          "peftbd.benchmarking.arms", "peftbd.benchmarking.environment", "peftbd.decoding",
          "peftbd.models", "peftbd.methods", "peftbd.training", "peftbd.data.artifact",
          "jobs.cost_profile"),
    command="python -m jobs.cost_profile",
)
"""One round of every arm timed at `cost_profile.architecture` (Qwen3-0.6B): the cost facts a tiny
model cannot show; the report projects them with the tiny run's acceptance."""
PLACEMENT = StageSpec(
    "placement", "placement experiment", "placement",
    reads=("preset", "model", "tiny_world", "data.source", "drafter", "mtp", "head", "serving",
           "decoding", "training.seed"),  # the seed: a random: model's weights
    inputs=(TRAIN_PEFTBD, TRAIN_MTP, TRAIN_HEAD, TRAIN_DFLASH),
    code=("peftbd.serving", "peftbd.decoding", "peftbd.models", "peftbd.methods",
          "peftbd.analysis.placement",
          "peftbd.analysis.placement_verdict",
          "peftbd.analysis.tables", "peftbd.analysis.paper", "peftbd.benchmarking.schema",
          "peftbd.benchmarking.cost_profile_schema", "peftbd.benchmarking.roofline",
          "peftbd.benchmarking.forward_counter", "peftbd.benchmarking.misfit", "serve_apps",
          "jobs.placement", "jobs.local_cluster"),
    command="python -m jobs.placement",
)
"""The placement experiment (outside the main job): when its output exists under the same root,
the benchmark's report summarises its verdict."""
RECIPE_ABLATION = StageSpec(
    "recipe_ablation", "DFlash recipe ablation", "recipe_ablation",
    reads=("model", "head", "dflash", "drafter.block_size", "training", "data.max_new_tokens"),
    ignores=("head.draft_vocab", "dflash.draft_vocab", *_PLACEMENT_ONLY),
    inputs=(GENERATE, TRAIN_HEAD, TRAIN_DFLASH),
    code=(*_TRAIN_CODE, "peftbd.methods", "peftbd.decoding", "peftbd.analysis.recipe_ablation",
          "jobs.recipe_ablation"),
    command="python -m jobs.recipe_ablation",
)
"""DFlash with each recipe change reverted in turn (outside the main job): when its output exists
under the same root, the benchmark's report shows its table."""
ACCEPTANCE_STUDY = StageSpec(
    "acceptance_study", "acceptance study", "acceptance_study",
    reads=("tiny_world", "model", "data", "generate", "drafter", "mtp", "head", "dflash",
           "training"),
    ignores=("tiny_world.shipped", *_PLACEMENT_ONLY),
    code=(*_TRAIN_CODE, "peftbd.methods", "peftbd.decoding", "peftbd.tiny_world",
          "peftbd.benchmarking.acceptance_study", "peftbd.benchmarking.replay",
          "peftbd.benchmarking.arms", "peftbd.analysis.acceptance_study", "jobs.acceptance_study",
          "jobs.generate", "jobs.pipeline"),
    command="python -m jobs.acceptance_study",
)
"""What decides acceptance: worlds and budgets varied one at a time, each drafter replayed per
category (outside the main job: its variants run the main job's stages under their own root)."""
BENCHMARK = StageSpec(
    "benchmark", "benchmark + report", "benchmark",
    reads=("preset", "model", "decoding", "data.max_prompt_len", "drafter.block_size",
           "drafter.early_exit_layers", "drafter.block_offsets", "drafter.offsets_ablation",
           "mtp.num_steps", "head.draft_vocab"),
    inputs=(GENERATE, TRAIN_PEFTBD, TRAIN_EARLY_EXIT, TRAIN_OFFSETS, TRAIN_MTP, TRAIN_HEAD,
            TRAIN_DFLASH, COST_PROFILE, PLACEMENT, RECIPE_ABLATION, ACCEPTANCE_STUDY),
    code=("peftbd.decoding", "peftbd.benchmarking", "peftbd.analysis", "peftbd.models",
          "peftbd.methods", "peftbd.cost_model", "jobs.benchmark"),
    command="python -m jobs.benchmark",
)

EXPERIMENTS: tuple[StageSpec, ...] = (PLACEMENT, RECIPE_ABLATION, ACCEPTANCE_STUDY)
"""Experiments run beside the main job: when one's output sits under its root, the benchmark
reads it and the report summarises it."""
STAGES: tuple[StageSpec, ...] = (WORLD, GENERATE, TRAIN_PEFTBD, TRAIN_EARLY_EXIT, TRAIN_OFFSETS,
                                 TRAIN_MTP, TRAIN_HEAD, TRAIN_DFLASH, COST_PROFILE, BENCHMARK)
"""The main job's stages in run order."""
BY_NAME = {s.name: s for s in STAGES}
PEFTBD_ADAPTERS: tuple[StageSpec, ...] = (TRAIN_PEFTBD, TRAIN_EARLY_EXIT, TRAIN_OFFSETS)
"""The stages whose output is a PEFT-BD adapter (the benchmark's PEFT-BD arms draft with them)."""
OTHER_OFFSETS: dict[BlockOffsets, BlockOffsets] = {"random": "aligned", "aligned": "random"}
"""`drafter.block_offsets` -> the recipe the offsets ablation trains."""

ENGINE_SPEED = StageSpec(
    "engine_speed", "engine speed check", "engine_speed",
    reads=("model", "tiny_world", "data.source", "data.max_prompt_len", "decoding", "drafter",
           "training.seed"),
    code=("peftbd.decoding", "peftbd.models", "peftbd.cost_model", "peftbd.data.sources",
          "peftbd.data.content_hash", "peftbd.data.chat", "peftbd.tiny_world",
          "peftbd.benchmarking.engine_speed"),
    command="python -m peftbd.benchmarking.engine_speed",
)
"""An experiment outside the main job, under the same contract (rerun only when its inputs change)."""
