"""The main job's stages, declared once: name, output subdirectory under the output root
(`<paths.out_dir>/<preset>` by default), the config they read, the upstream stages they consume
and the code that decides their output. The pipeline, the stage jobs' defaults, their skip
decisions (`peftbd.stage`) and the report's stage table all read them from here."""

from __future__ import annotations

from peftbd.method_catalog import entries
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
                  "peftbd.decoding.row_batch",
                  "peftbd.decoding.cache_adapter", "peftbd.decoding.state", "peftbd.decoding.drafter",
                  "peftbd.decoding.metrics", "peftbd.decoding.clock", "peftbd.decoding.fast_path",
                  "peftbd.decoding.sampling", "peftbd.decoding.packed", "peftbd.decoding.scheduler",
                  "peftbd.models.early_exit", "peftbd.models.cpu_linear")
"""The engine's greedy AR, which decodes generate's continuations (its drafters do not)."""
GENERATE = StageSpec(
    "generate", "generate continuations", "continuations", reads=("model", "data", "generate.backend"),
    ignores=("data.source",),  # where the prompts lie: their content is in extra["source"]
    inputs=(WORLD,), code=("peftbd.data", "peftbd.models.loading", "peftbd.models.sources",
                           "peftbd.models.architecture", "peftbd.peers.vllm_env", "jobs.generate",
                           "jobs.generate_vllm", "jobs.vllm_node", *_GREEDY_ENGINE),
    command="python -m jobs.generate",
)
_TRAIN_CODE = ("peftbd.training", "peftbd.intervals", "peftbd.models", "peftbd.data.artifact",
               "jobs.train_common")


def training_stage(method_id: str, title: str, *, variant: str = "", reads: tuple[str, ...] = (),
                   ignores: tuple[str, ...] = (), code: tuple[str, ...] = (), how: str = "") -> StageSpec:
    """A drafting method's training stage, every name derived from its id by one rule: stage
    `train_<id>[_<variant>]`, output dir `<id>[_<variant>]`, the section `<id>` (and `reads`),
    run by `python -m jobs.train --method <id>` (`how`: the `--set` a variant adds). `code`: the
    modules beyond the package's training code whose source decides it (a plugin: its own)."""
    suffix = f"_{variant}" if variant else ""
    return StageSpec(
        f"train_{method_id}{suffix}", title, f"{method_id}{suffix}",
        reads=("model", method_id, "training", *reads), ignores=(*ignores, *_PLACEMENT_ONLY),
        inputs=(GENERATE,), code=(*_TRAIN_CODE, *code), job=f"train_{method_id}" if variant else "",
        command=f"python -m jobs.train --method {method_id}{' ' + how if how else ''}",
    )


def method_sections() -> tuple[str, ...]:
    """Every registered method's config section (its id)."""
    return tuple(m.id for m in entries())


def plugin_modules() -> tuple[str, ...]:
    """The modules of registered methods outside the package (`methods.plugins`): their source
    decides what the stages that draft with them compute."""
    found = (m.arms.__module__ for m in entries())
    package = __name__.split(".")[0]
    return tuple(dict.fromkeys(name for name in found if name.split(".")[0] != package))


def training_stages() -> tuple[StageSpec, ...]:
    """Every registered method's training stages, in registration order."""
    return tuple(s for m in entries() for s in m.stages)


def _cost_reads() -> tuple[str, ...]:
    """The method keys the cost profile reads (`Method.cost_reads`; None: the whole section)."""
    return tuple(key for m in entries()
                 for key in ((m.id,) if m.cost_reads is None else (f"{m.id}.{k}" for k in m.cost_reads)))


def cost_profile_stage() -> StageSpec:
    """One round of every arm timed at `cost_profile.architecture` (Qwen3-0.6B): the cost facts a
    tiny model cannot show; the report projects them with the tiny run's acceptance. It reads
    the keys of each method's section that shape its untrained modules (`Method.cost_reads`)."""
    return StageSpec(
        "cost_profile", "cost profile at the paper's architecture", "cost_profile",
        reads=("cost_profile", "model.attn_implementation", *_cost_reads(), "training.seed",
               "decoding.synthetic", "decoding.synthetic_seed", "decoding.fast_path"),
        ignores=tuple(f"{m.id}.optim" for m in entries() if m.cost_reads is None),
        code=("peftbd.benchmarking.cost_profile", "peftbd.benchmarking.cost_profile_models",
              "peftbd.benchmarking.cost_profile_schema", "peftbd.benchmarking.misfit",
              "peftbd.benchmarking.forward_paths",
              "peftbd.benchmarking.forward_counter", "peftbd.benchmarking.roofline",
              "peftbd.benchmarking.device_floor", "peftbd.benchmarking.shape_decode",
              "peftbd.benchmarking.arms", "peftbd.benchmarking.environment", "peftbd.decoding",
              "peftbd.models", "peftbd.methods", "peftbd.training", "peftbd.intervals",
              "peftbd.data.artifact", "jobs.cost_profile", *plugin_modules()),
        command="python -m jobs.cost_profile",
    )


def placement_stage() -> StageSpec:
    """The placement experiment (outside the main job): when its output exists under the same
    root, the benchmark's report summarises its verdict (and the simulated placement's first
    screen when placement_sim/ sits beside it; placement.md shows it too when it was there)."""
    return StageSpec(
        "placement", "placement experiment", "placement",
        reads=("preset", "model", "tiny_world", "data.source", *method_sections(), "serving",
               "decoding", "training.seed"),  # the seed: a random: model's weights
        inputs=tuple(m.stages[0] for m in entries() if m.stages),  # each method's main stage
        code=("peftbd.serving", "peftbd.decoding", "peftbd.models", "peftbd.methods",
              "peftbd.analysis.placement", "peftbd.analysis.placement_verdict", "peftbd.analysis.json_file",
              "peftbd.analysis.placement_ahead",
              "peftbd.analysis.placement_ledger", "peftbd.analysis.placement_sim",
              "peftbd.analysis.placement_sim_summary", "peftbd.simulation",
              "peftbd.analysis.tables", "peftbd.analysis.paper", "peftbd.benchmarking.schema",
              "peftbd.benchmarking.cost_profile_schema", "peftbd.benchmarking.roofline",
              "peftbd.benchmarking.forward_counter", "peftbd.benchmarking.misfit", "serve_apps",
              "jobs.placement", "jobs.placement_options", "jobs.local_cluster", *plugin_modules()),
        command="python -m jobs.placement",
    )


def recipe_ablation_stage() -> StageSpec:
    """DFlash with each recipe change reverted in turn (outside the main job): when its output
    exists under the same root, the benchmark's report shows its table."""
    known = {m.id: m for m in entries()}
    head, dflash = known["peftbd_head"], known["dflash"]
    return StageSpec(
        "recipe_ablation", "DFlash recipe ablation", "recipe_ablation",
        reads=("model", head.id, dflash.id, "training", "data.max_new_tokens"),
        ignores=(f"{head.id}.draft_vocab", f"{dflash.id}.draft_vocab", *_PLACEMENT_ONLY),
        inputs=(GENERATE, *head.stages[:1], *dflash.stages[:1]),
        code=(*_TRAIN_CODE, "peftbd.methods", "peftbd.decoding", "peftbd.analysis.recipe_ablation",
              "jobs.recipe_ablation"),
        command="python -m jobs.recipe_ablation",
    )


def acceptance_study_stage() -> StageSpec:
    """What decides acceptance: worlds and budgets varied one at a time, each drafter replayed
    per category (outside the main job: its variants run the main job's stages under their own
    root)."""
    return StageSpec(
        "acceptance_study", "acceptance study", "acceptance_study",
        reads=("tiny_world", "model", "data", "generate", *method_sections(), "training"),
        ignores=("tiny_world.shipped", *_PLACEMENT_ONLY),
        code=(*_TRAIN_CODE, "peftbd.methods", "peftbd.decoding", "peftbd.tiny_world",
              "peftbd.benchmarking.acceptance_study", "peftbd.benchmarking.replay",
              "peftbd.benchmarking.arms", "peftbd.analysis.acceptance_study", "jobs.acceptance_study",
              "jobs.generate", "jobs.pipeline"),
        command="python -m jobs.acceptance_study",
    )


def experiments() -> tuple[StageSpec, ...]:
    """Experiments run beside the main job: when one's output sits under its root, the
    benchmark reads it and the report summarises it."""
    return (placement_stage(), recipe_ablation_stage(), acceptance_study_stage(), peer_stage())


def benchmark_stage() -> StageSpec:
    """The benchmark and report: every registered method's arms (reading each method's section
    but what trains it), over the main job's artifacts and the experiments beside them."""
    return StageSpec(
        "benchmark", "benchmark + report", "benchmark",
        reads=("preset", "model", "decoding", "data.max_prompt_len", *method_sections()),
        ignores=tuple(f"{m}.optim" for m in method_sections()),
        inputs=(GENERATE, *training_stages(), cost_profile_stage(), *experiments()),
        code=("peftbd.decoding", "peftbd.benchmarking", "peftbd.analysis", "peftbd.models",
              "peftbd.methods", "peftbd.cost_model", "jobs.benchmark", *plugin_modules()),
        command="python -m jobs.benchmark",
    )


def stages() -> tuple[StageSpec, ...]:
    """The main job's stages in run order: the world, generate, every registered method's
    training stages, the cost profile, the benchmark."""
    return (WORLD, GENERATE, *training_stages(), cost_profile_stage(), benchmark_stage())


ENGINE_SPEED = StageSpec(
    "engine_speed", "engine speed check", "engine_speed",
    reads=("model", "tiny_world", "data.source", "data.max_prompt_len", "decoding", "peftbd",
           "training.seed"),
    code=("peftbd.decoding", "peftbd.models", "peftbd.cost_model", "peftbd.data.sources",
          "peftbd.data.content_hash", "peftbd.data.chat", "peftbd.tiny_world",
          "peftbd.peers", "peftbd.data.artifact", "peftbd.benchmarking.prompts",
          "peftbd.benchmarking.references", "peftbd.benchmarking.interleaved",
          "peftbd.benchmarking.engine_speed"),
    command="python -m peftbd.benchmarking.engine_speed",
)
"""An experiment outside the main job, under the same contract (rerun only when its inputs change)."""



def peer_stage() -> StageSpec:
    """Outside the main job, as the engine speed check: our engine beside vLLM (needs
    `scripts/install.sh --with-vllm`); its prompt-lookup arm reads the methods' sections, and
    its DFlash pair the main job's DFlash head (an upstream when there is one)."""
    dflash = {m.id: m for m in entries()}["dflash"]
    return StageSpec(
        "peer", "peer table (vLLM beside us)", "peer",
        inputs=dflash.stages[:1],
        reads=("model", "tiny_world", "data.source", "data.max_prompt_len", "decoding.fast_path",
               *method_sections(), "cost_profile.architecture", "training.seed"),
        code=("peftbd.decoding", "peftbd.models", "peftbd.data.sources", "peftbd.data.chat",
              "peftbd.data.content_hash", "peftbd.data.artifact", "peftbd.tiny_world",
              "peftbd.methods", "peftbd.training", "peftbd.intervals", "peftbd.peers",
              "peftbd.benchmarking.interleaved",
              "peftbd.benchmarking.noise", "peftbd.benchmarking.peer", "peftbd.benchmarking.peer_dflash",
              "peftbd.benchmarking.environment",
              "peftbd.benchmarking.peer_runs", "peftbd.benchmarking.peer_schema",
              "peftbd.analysis.peer", "jobs.peer", "jobs.vllm_node"),
        command="python -m jobs.peer",
    )
