"""Benchmark stage: AR, PEFT-BD (1 step; 2 steps; anchored) and FastMTP on held-out prompts ->
results.json, report.md and Figure 1.

    python -m jobs.benchmark --preset tiny --artifacts outputs/tiny
    python -m jobs.benchmark --preset tiny --artifacts outputs/tiny \
        --prompts spec-bench ../shared/data/spec_bench/question.jsonl --out outputs/tiny/spec-bench
    ray job submit --working-dir . -- python -m jobs.benchmark --preset qwen3-0.6b \
        --artifacts /mnt/shared/peftbd --set decoding.workers=4

`--artifacts` is the main job's output root: `continuations/` (the generate artifact; its test
split gives the prompts), `peftbd_adapter/` and `mtp_head/` (the training jobs' outputs: the
adapter in `peftbd_adapter/adapter/`, the head in `mtp_head/mtp_head/`). Greedy, batch 1,
`decoding.max_new_tokens` new tokens, `decoding.num_prompts` prompts, every arm `--repeats` times.

Timing placement: the prompts are split round-robin over `decoding.workers` Ray tasks, each with
`decoding.worker_num_gpus` GPUs / `worker_num_cpus` CPUs and `decoding.torch_threads` torch
threads, and each times its own prompts one after another. Throughput is tokens over the summed
per-prompt decode time, so it does not depend on the worker count. On a GPU cluster use one worker
per GPU; on a small CPU box keep one worker, because parallel workers share the cores and distort
the per-round clock. results.json records the placement.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import ray

from jobs.ray_env import init_ray
from peftbd.analysis.report import (
    BENCHMARK_STAGE,
    REPORT,
    build_report,
    read_stage_manifests,
    summary_lines,
)
from peftbd.benchmarking.arms import arm_specs
from peftbd.benchmarking.prompts import PromptError, PromptSet, load_prompts
from peftbd.benchmarking.results import build_results, stage_stats
from peftbd.benchmarking.runner import ShardResult, run_shard
from peftbd.cli import add_config_args, config_from_args
from peftbd.config import Config
from peftbd.data.artifact import ArtifactError
from peftbd.data.sources import SPEC_BENCH_PREFIX, SourceError
from peftbd.layout import ADAPTER, BENCHMARK, CONTINUATIONS, EARLY_EXIT, MTP_HEAD
from peftbd.manifest import (
    StageTimer,
    atomic_output_dir,
    is_complete,
    read_manifest,
    versions,
    write_manifest,
)
from peftbd.models.loading import ModelUnavailableError

log = logging.getLogger(__name__)

RESULTS = "results.json"
PLACEMENT = ("prompts split round-robin over the workers (Ray tasks); each worker times its prompts "
             "one at a time (batch 1); per repeat the arms take turns over all prompts after one "
             "untimed warm-up decode each; throughput = tokens / summed per-prompt decode time.")


class BenchmarkInputError(ValueError):
    """A missing input artifact or a bad option; the message says how to fix it."""


def _require(artifacts: Path, sub: str, how: str) -> Path:
    path = artifacts / sub
    if not is_complete(path):
        raise BenchmarkInputError(
            f"--artifacts {str(artifacts)!r} has no finished {sub}/ (no {path}/manifest.json); "
            f"{how}, or run the main job: python -m jobs.pipeline --out {artifacts}"
        )
    return path


def time_on_workers(cfg: Config, adapter: Path, head: Path, prompt_set: PromptSet,
                    repeats: int, early_exit: Path | None = None) -> list[ShardResult]:
    """Split the prompts round-robin over `decoding.workers` Ray tasks; each times its share."""
    d = cfg.decoding
    n = max(1, min(d.workers, len(prompt_set.prompts)))
    task = ray.remote(run_shard).options(num_cpus=d.worker_num_cpus, num_gpus=d.worker_num_gpus)
    specs = arm_specs(cfg)
    exit_dir = None if early_exit is None else str(early_exit)
    refs = [task.remote(cfg, str(adapter), str(head), specs, prompt_set.prompts[i::n], repeats,
                        exit_dir) for i in range(n)]
    return ray.get(refs)


def _drafter_info(path: Path) -> dict[str, Any]:
    manifest = read_manifest(path)
    return {"path": str(path),
            **{k: v for k, v in manifest.items() if k not in ("config", "versions")}}


def run_benchmark(cfg: Config, artifacts_dir: str | Path, out_dir: str | Path,
                  prompts: str = "test", repeats: int | None = None) -> Path:
    """Time every arm on the held-out prompts under `artifacts_dir`; write results.json, report.md,
    Figure 1 and (last) manifest.json into `out_dir`. Joins the running Ray or starts one.
    Returns `out_dir`."""
    timer = StageTimer()
    artifacts, out_dir = Path(artifacts_dir), Path(out_dir)
    repeats = cfg.decoding.repeats if repeats is None else repeats
    if repeats < 1:
        raise BenchmarkInputError(f"repeats={repeats}: need at least 1 (decoding.repeats / --repeats)")
    if cfg.decoding.max_new_tokens < 2:
        raise BenchmarkInputError(
            f"decoding.max_new_tokens={cfg.decoding.max_new_tokens}: need >= 2, since prefill "
            "commits the first token and speculative rounds start with the second"
        )
    adapter = _require(artifacts, ADAPTER, f"train it with python -m jobs.train_peftbd --out "
                                           f"{artifacts / ADAPTER}")
    head = _require(artifacts, MTP_HEAD, f"train it with python -m jobs.train_mtp --out "
                                         f"{artifacts / MTP_HEAD}")
    exit_k = cfg.drafter.early_exit_layers
    early_exit = None if exit_k <= 0 else _require(
        artifacts, EARLY_EXIT, f"train it with python -m jobs.train_peftbd --set "
        f"drafter.draft_layers={exit_k} --out {artifacts / EARLY_EXIT} (or set "
        "drafter.early_exit_layers=0 to leave the early-exit arm out)")
    if prompts == "test":
        _require(artifacts, CONTINUATIONS, f"build it with python -m jobs.generate --out "
                                           f"{artifacts / CONTINUATIONS}")
    prompt_set = load_prompts(cfg, artifacts / CONTINUATIONS, prompts)
    init_ray()
    log.info("benchmark: %d prompts x %d arms x %d repeats on %d worker(s)",
             len(prompt_set.prompts), len(arm_specs(cfg)), repeats, cfg.decoding.workers)
    shards = time_on_workers(cfg, adapter, head, prompt_set, repeats, early_exit)
    drafters = {ADAPTER: _drafter_info(adapter), MTP_HEAD: _drafter_info(head)}
    if early_exit is not None:
        drafters[EARLY_EXIT] = _drafter_info(early_exit)
    results = build_results(cfg, prompt_set, shards, repeats, drafters, PLACEMENT)
    stats = stage_stats(timer.stats(), shards)  # the same numbers in the report and the manifest
    manifests = {**read_stage_manifests(artifacts), BENCHMARK_STAGE: stats}
    with atomic_output_dir(out_dir) as tmp:
        (tmp / RESULTS).write_text(json.dumps(results, indent=2, default=str))
        build_report(results, manifests, tmp)
        write_manifest(tmp, {"stage": "benchmark", "prompts": results["prompts"],
                             "timing": results["timing"], "summary": summary_lines(results),
                             "config": cfg.to_dict(), "versions": versions(), **stats})
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.benchmark", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(parser)
    parser.add_argument("--artifacts", type=Path, default=None,
                        help="the main job's output root (holds continuations/, peftbd_adapter/, "
                             "mtp_head/ and, when drafter.early_exit_layers > 0, "
                             "peftbd_early_exit/; default: <paths.out_dir>/<preset>)")
    parser.add_argument("--prompts", nargs="+", default=["test"], metavar="WHICH",
                        help="'test': the artifact's held-out split (default); 'spec-bench PATH': "
                             "Spec-Bench's question.jsonl, reported per category")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed runs per arm (default: decoding.repeats)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output dir (default: <artifacts>/benchmark, or "
                             "<artifacts>/benchmark-spec-bench for Spec-Bench prompts)")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.artifacts = args.artifacts or Path(cfg.paths.out_dir) / cfg.preset
    if args.prompts == ["test"]:
        prompts, default_out = "test", args.artifacts / BENCHMARK
    elif len(args.prompts) == 2 and args.prompts[0] == "spec-bench":
        prompts = f"{SPEC_BENCH_PREFIX}{args.prompts[1]}"
        default_out = args.artifacts / f"{BENCHMARK}-spec-bench"
    else:
        parser.error(f"--prompts {' '.join(args.prompts)}: use 'test' or 'spec-bench PATH'")
    try:
        out = run_benchmark(cfg, args.artifacts, args.out or default_out, prompts, args.repeats)
    except (BenchmarkInputError, PromptError, ArtifactError, SourceError,
            ModelUnavailableError) as exc:
        sys.exit(f"error: {exc}")
    results = json.loads((out / RESULTS).read_text())
    print("\n".join(summary_lines(results)))
    print(f"benchmark report: {(out / REPORT).resolve()}")


if __name__ == "__main__":
    # Run from the importable module, so Ray pickles `jobs.benchmark.*` by reference, not `__main__`.
    from jobs.benchmark import main as _main

    _main()
