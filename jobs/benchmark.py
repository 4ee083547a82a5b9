"""Benchmark stage: AR, PEFT-BD (1 step; 2 steps; anchored; early exit; the offsets ablation),
FastMTP and the block-diffusion head on held-out prompts -> results.json, report.md and Figure 1.

    python -m jobs.benchmark --preset tiny --artifacts outputs/tiny
    python -m jobs.benchmark --preset tiny --artifacts outputs/tiny \
        --prompts spec-bench ../shared/data/spec_bench/question.jsonl --out outputs/tiny/spec-bench
    ray job submit --working-dir . -- python -m jobs.benchmark --preset qwen3-0.6b \
        --artifacts /mnt/shared/peftbd --set decoding.workers=4

`--artifacts` is the main job's output root: `continuations/` (the generate artifact; its test
split gives the prompts; its train split, the head's draft vocabulary), each method's training
output under its id (`peftbd/`, `fastmtp/`, `peftbd_head/`, `dflash/`: the adapter in
`peftbd/adapter/`, the heads in `fastmtp/mtp_head/` and `peftbd_head/bd_head/`) and, when it exists,
`cost_profile/` (jobs.cost_profile: the report projects its cost at scale with this run's
acceptance). Greedy, batch 1,
`decoding.max_new_tokens` new tokens, `decoding.num_prompts` prompts, every arm `--repeats` times;
and the concurrency sweep: every arm again at each `decoding.batch_sizes` entry B > 1 (continuous
batching, at most B prompts at once; tiny: [1, 16], tiny-full: [1, 4, 16]) in the first
`decoding.sweep_repeats` repeats, aggregate tok/s = tokens / wall time of the whole pass; then at
each `decoding.temperatures` entry > 0 one sampled batch-1 pass per arm but the synthetic ones over
the first `decoding.sampling_prompts` prompts (results.json `sampling`, the report's Table 11).
Last, untimed, every one-step drafter's rounds are replayed offline on the same prompts + AR's
outputs (results.json `arms.*.replay`; the report's Table 6 sets the engine's acceptance beside
it and beside training's estimate).

Timing placement: the prompts are split round-robin over `decoding.workers` Ray tasks, each with
`decoding.worker_num_gpus` GPUs / `worker_num_cpus` CPUs and `decoding.torch_threads` torch
threads, and each times its own prompts one after another. Throughput is tokens over the summed
per-prompt decode time, so it does not depend on the worker count. On a GPU cluster use one worker
per GPU; on a CPU box at most one single-threaded worker per core (the tiny preset: 2). Parallel
workers still share the memory system: on the 2-core box two workers measured 0-9% (mean 4%)
below one worker's tok/s per arm (docs/results-log.md); `--set decoding.workers=1` for the
undisturbed clock, at twice the time. A sweep pass covers a worker's own prompts, so with fewer
than B of them a batch size B runs as one batch that drains. results.json records the placement.
"""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ray

from jobs.progress import relay
from jobs.ray_env import init_ray, shutdown
from peftbd.analysis.placement_sim_summary import beside_lines
from peftbd.analysis.report import (
    BENCHMARK_STAGE,
    REPORT,
    build_report,
    read_stage_manifests,
    summary_lines,
)
from peftbd.benchmarking.arms import DrafterDirs, arm_specs
from peftbd.benchmarking.cost_profile_schema import PROFILE_FILE, CostProfile
from peftbd.benchmarking.schema import DrafterInfo, Results
from peftbd.benchmarking.prompts import PromptSet, load_prompts
from peftbd.benchmarking.forward_paths import cuda_graph_fallbacks
from peftbd.benchmarking.results import build_results, stage_stats
from peftbd.benchmarking.runner import ShardResult, run_shard
from peftbd.benchmarking.sampled import sampled_prompts, sampled_temperatures
from peftbd.cli import add_config_args, add_stage_args, config_from_args, output_root, run_stage_job
from peftbd.config import Config
from peftbd.data.draft_vocab import draft_vocabulary
from peftbd.data.sources import SPEC_BENCH_PREFIX, source_identity
from peftbd.errors import UserError
from peftbd.layout import GENERATE, benchmark_stage, cost_profile_stage, experiments, placement_stage
from peftbd.manifest import StageTimer, is_complete, read_manifest
from peftbd.methods import methods
from peftbd.stage import StageCall, StageInputs, StageSpec
from peftbd.models.loading import load_tokenizer

log = logging.getLogger(__name__)

RESULTS = "results.json"
TIMING_PLACEMENT = ("prompts split round-robin over the workers (Ray tasks); each worker times its prompts "
             "one at a time (batch 1); per repeat the arms take turns over all prompts after one "
             "short untimed warm-up decode each; throughput = tokens / summed per-prompt decode time. "
             "Concurrency sweep: per repeat (at batch sizes > 1: the first decoding.sweep_repeats) "
             "and batch size the arms take turns at one pass over the worker's prompts with "
             "continuous batching (batch 1: the batch-1 pass; at B > 1 AR and each method's own "
             "arm, the variants too with decoding.sweep_variants); aggregate throughput = tokens / wall "
             "time of the pass (summed over workers), median over those repeats.")


class BenchmarkInputError(UserError, ValueError):
    """A bad option; the message says how to fix it."""


def time_on_workers(cfg: Config, dirs: DrafterDirs, prompt_set: PromptSet,
                    repeats: int) -> list[ShardResult]:
    """Split the prompts round-robin over `decoding.workers` Ray tasks; each times its share."""
    d = cfg.decoding
    n = max(1, min(d.workers, len(prompt_set.prompts)))
    task = ray.remote(run_shard).options(num_cpus=d.worker_num_cpus, num_gpus=d.worker_num_gpus)
    specs, sampled = arm_specs(cfg), sampled_prompts(cfg, prompt_set.prompts)
    with relay() as sink:
        # Ray's overloads type `run_shard` (three of its eight arguments defaulted) as five-ary;
        # the first shard checks the independent references (one vLLM engine a run)
        refs = [task.remote(cfg, dirs, specs, prompt_set.prompts[i::n], repeats,  # type: ignore[call-arg]
                            sink and sink.part(i), sampled[i::n], i == 0) for i in range(n)]
        return ray.get(refs)


def training_stages(cfg: Config) -> list[StageSpec]:
    """The training stages whose drafters `cfg`'s arms use: every registered method's
    (`Method.training_stages`: the early-exit adapter only when `peftbd.early_exit_layers` > 0,
    the offsets ablation's only with `peftbd.offsets_ablation`)."""
    return [stage for m in methods() for stage, _ in m.training_stages(cfg)]


def drafter_dirs(cfg: Config, upstream: Mapping[str, Path]) -> tuple[DrafterDirs, dict[str, Any] | None]:
    """Where the arms' drafters lie, and the draft vocabulary the methods' arms read (the most
    tokens any `Method.draft_vocab` asks for, of the continuation artifact's train split) as
    results.json records it (None: none)."""
    vocab: dict[str, Any] | None = None
    wants = {m.id: m.draft_vocab(cfg) for m in methods() if m.draft_vocab is not None}
    size = max(wants.values(), default=0)
    if size > 0:
        asks = ", ".join(f"{k}.draft_vocab={v}" for k, v in wants.items() if v > 0)
        if GENERATE.name not in upstream:
            raise BenchmarkInputError(
                f"{asks}: the draft vocabulary is counted over the continuation artifact's train "
                "split, and there is none under --artifacts; generate it (python -m jobs.generate) "
                "or set them to 0")
        found = draft_vocabulary(upstream[GENERATE.name], size, len(load_tokenizer(cfg)))
        vocab = {"size": len(found.ids), "train_token_coverage": round(found.coverage, 4)}
    dirs = DrafterDirs({s.name: str(upstream[s.name]) for s in training_stages(cfg)
                        if s.name in upstream},
                       draft_vocab=found.ids if vocab else None)
    return dirs, vocab


def _vocab_stages(cfg: Config) -> set[str]:
    """The training stages whose method's arms read the draft vocabulary."""
    return {s.name for m in methods() if m.draft_vocab is not None and m.draft_vocab(cfg) > 0
            for s in m.stages}


def _drafter_info(path: Path, draft_vocab: dict[str, Any] | None = None) -> DrafterInfo:
    manifest = read_manifest(path)
    return DrafterInfo(path=str(path), draft_vocab=draft_vocab, **{
        k: v for k, v in manifest.items() if k not in ("config", "versions", "contract")})


def layout_inputs(cfg: Config, artifacts_dir: str | Path, prompts: str = "test") -> dict[str, Path]:
    """{stage name: dir} of the benchmark's inputs in the main job's layout under `artifacts_dir`
    (the early-exit adapter only when `peftbd.early_exit_layers` > 0, the offsets ablation's
    only with `peftbd.offsets_ablation`; the continuations, whose test split gives the prompts,
    also for Spec-Bench prompts when they exist, for the report; the cost profile when it exists,
    for the report's "cost at the paper's architecture"; the placement experiment's output when
    it exists, for its verdict)."""
    root = Path(artifacts_dir)
    needed, profile = training_stages(cfg), cost_profile_stage()
    needed += [profile] if is_complete(root / profile.subdir) else []
    needed += [e for e in experiments() if is_complete(root / e.subdir)]
    if prompts == "test" or is_complete(root / GENERATE.subdir):
        needed.insert(0, GENERATE)
    return {spec.name: root / spec.subdir for spec in needed}


def benchmark_call(cfg: Config, inputs: Mapping[str, Path], out_dir: str | Path,
                   prompts: str = "test", repeats: int | None = None) -> StageCall:
    """The benchmark stage over `inputs` ({stage name: artifact dir}: the `training_stages`,
    generate for test prompts and the draft vocabulary, optionally the cost profile and the
    placement experiment), writing results.json, report.md and the figures into `out_dir`."""
    repeats = cfg.decoding.repeats if repeats is None else repeats
    if repeats < 1:
        raise BenchmarkInputError(f"repeats={repeats}: need at least 1 (decoding.repeats / --repeats)")
    if cfg.decoding.max_new_tokens < 2:
        raise BenchmarkInputError(
            f"decoding.max_new_tokens={cfg.decoding.max_new_tokens}: need >= 2, since prefill "
            "commits the first token and speculative rounds start with the second"
        )
    sampled_temperatures(cfg)  # a temperature the engine would decode greedily: say so now
    signature = prompts if prompts == "test" else source_identity(cfg, prompts)
    build = functools.partial(_build, cfg=cfg, upstream=dict(inputs), prompts=prompts, repeats=repeats)
    return StageCall(benchmark_stage(), cfg.to_dict(), Path(out_dir), dict(inputs), build,
                     extra={"prompts": signature, "repeats": repeats})


def _build(tmp: Path, inputs: StageInputs, cfg: Config, upstream: dict[str, Path], prompts: str,
           repeats: int) -> dict[str, Any]:
    timer = StageTimer()
    prompt_set = load_prompts(cfg, upstream.get(GENERATE.name), prompts)
    init_ray()
    log.info("benchmark: %d prompts x %d arms x %d repeats on %d worker(s)",
             len(prompt_set.prompts), len(arm_specs(cfg)), repeats, cfg.decoding.workers)
    dirs, vocab = drafter_dirs(cfg, upstream)
    shards = time_on_workers(cfg, dirs, prompt_set, repeats)
    vocab_stages = _vocab_stages(cfg)
    drafters = {spec.subdir: _drafter_info(upstream[spec.name],
                                           vocab if spec.name in vocab_stages else None)
                for spec in training_stages(cfg)}
    results = build_results(cfg, prompt_set, shards, repeats, drafters, TIMING_PLACEMENT)
    cuda_graph_fallbacks(results.arms, cfg.decoding.fast_path)  # true: an error; auto: the report
    profile = cost_profile_stage().name
    if profile in upstream:
        results.cost_at_scale = CostProfile.read(upstream[profile] / PROFILE_FILE)
    stats = stage_stats(timer.stats(), shards)  # the same numbers in the report and the manifest
    manifests = {**read_stage_manifests(upstream), BENCHMARK_STAGE: stats}
    for experiment in experiments():  # beside the main job: summarised
        if experiment.name in upstream:
            manifests[experiment.title] = read_manifest(upstream[experiment.name])
    placement = placement_stage().name  # the simulated placement beside it: its first screen,
    # linked relative to `tmp` (out's `.partial` sibling, so the link holds for out too)
    simulated = beside_lines(upstream[placement], tmp) if placement in upstream else []
    results.write(tmp / RESULTS)
    build_report(results, manifests, tmp, simulated)
    return {"prompts": results.prompts.model_dump(), "timing": results.timing.model_dump(),
            "summary": summary_lines(results), **stats}


def run_benchmark(cfg: Config, artifacts_dir: str | Path, out_dir: str | Path,
                  prompts: str = "test", repeats: int | None = None, force: bool = False) -> Path:
    """Time every arm on the held-out prompts under `artifacts_dir`; write results.json, report.md,
    Figure 1 and (last) manifest.json into `out_dir`, unless it is current for these inputs.
    Joins the running Ray or starts one. Returns `out_dir`."""
    benchmark_call(cfg, layout_inputs(cfg, artifacts_dir, prompts), out_dir, prompts, repeats).run(force)
    return Path(out_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.benchmark", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(parser)
    parser.add_argument("--artifacts", type=Path, default=None,
                        help="the main job's output root (holds continuations/ and each method's "
                             "training output, <method id>/: peftbd/, fastmtp/, peftbd_head/, "
                             "dflash/, peftbd_early_exit/ when peftbd.early_exit_layers > 0, "
                             "peftbd_offsets/ with peftbd.offsets_ablation; default: "
                             "<paths.out_dir>/<preset>)")
    parser.add_argument("--prompts", nargs="+", default=["test"], metavar="WHICH",
                        help="'test': the artifact's held-out split (default); 'spec-bench PATH': "
                             "Spec-Bench's question.jsonl, reported per category")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed runs per arm (default: decoding.repeats)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output dir (default: <artifacts>/benchmark, or "
                             "<artifacts>/benchmark-spec-bench for Spec-Bench prompts)")
    add_stage_args(parser)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    args.artifacts = args.artifacts or output_root(cfg)
    bench = benchmark_stage()
    if args.prompts == ["test"]:
        prompts, default_out = "test", args.artifacts / bench.subdir
    elif len(args.prompts) == 2 and args.prompts[0] == "spec-bench":
        prompts = f"{SPEC_BENCH_PREFIX}{args.prompts[1]}"
        default_out = args.artifacts / f"{bench.subdir}-spec-bench"
    else:
        parser.error(f"--prompts {' '.join(args.prompts)}: use 'test' or 'spec-bench PATH'")
    out = args.out or default_out
    inputs = layout_inputs(cfg, args.artifacts, prompts)
    run_stage_job(bench, out, lambda: benchmark_call(cfg, inputs, out, prompts, args.repeats),
                  args.force, args.verbose, before_exit=shutdown)
    print("\n".join(summary_lines(Results.read(out / RESULTS))))
    print(f"benchmark report: {(out / REPORT).resolve()}")


if __name__ == "__main__":
    # Run from the importable module, so Ray pickles `jobs.benchmark.*` by reference, not `__main__`.
    from jobs.benchmark import main as _main

    _main()
