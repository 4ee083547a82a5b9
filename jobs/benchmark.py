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
import datetime
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
from peftbd.benchmarking.aggregate import add_oracles, arm_entries
from peftbd.benchmarking.arms import arm_specs
from peftbd.benchmarking.prompts import PromptSet, spec_bench_prompts, held_out_prompts
from peftbd.benchmarking.runner import ShardResult, run_shard
from peftbd.benchmarking.schema import SCHEMA
from peftbd.cli import add_config_args, config_from_args
from peftbd.config import Config
from peftbd.data.sources import SPEC_BENCH_PREFIX, SourceError
from peftbd.manifest import (
    StageTimer,
    atomic_output_dir,
    is_complete,
    read_manifest,
    versions,
    write_manifest,
)
from peftbd.models.loading import ModelUnavailableError, load_tokenizer
from peftbd.training.tasks import ADAPTER_DIR, MTP_HEAD_DIR

log = logging.getLogger(__name__)

CONTINUATIONS, ADAPTER, MTP_HEAD, BENCHMARK = "continuations", "peftbd_adapter", "mtp_head", "benchmark"
RESULTS = "results.json"


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


def load_prompts(cfg: Config, artifacts: Path, prompts: str) -> PromptSet:
    """`prompts` = "test" (the artifact's test split) or "spec-bench:PATH" (question.jsonl)."""
    limit = cfg.decoding.num_prompts
    if prompts == "test":
        cont = _require(artifacts, CONTINUATIONS, f"build it with python -m jobs.generate --out "
                                                  f"{artifacts / CONTINUATIONS}")
        return held_out_prompts(cont, limit)
    if prompts.startswith(SPEC_BENCH_PREFIX):
        path = prompts[len(SPEC_BENCH_PREFIX):]
        return spec_bench_prompts(cfg, load_tokenizer(cfg), path, limit)
    raise BenchmarkInputError(
        f"prompts={prompts!r}: use 'test' (the artifact's held-out split) or "
        f"'spec-bench:PATH' (Spec-Bench's question.jsonl)"
    )


def time_on_workers(cfg: Config, adapter: Path, head: Path, prompt_set: PromptSet,
                    repeats: int) -> list[ShardResult]:
    """Split the prompts round-robin over `decoding.workers` Ray tasks; each times its share."""
    d = cfg.decoding
    n = max(1, min(d.workers, len(prompt_set.prompts)))
    task = ray.remote(run_shard).options(num_cpus=d.worker_num_cpus, num_gpus=d.worker_num_gpus)
    specs = arm_specs(cfg)
    refs = [task.remote(cfg, str(adapter), str(head), specs, prompt_set.prompts[i::n], repeats)
            for i in range(n)]
    return ray.get(refs)


def _drafter_info(path: Path) -> dict[str, Any]:
    manifest = read_manifest(path)
    return {"path": str(path),
            **{k: v for k, v in manifest.items() if k not in ("config", "versions")}}


def build_results(cfg: Config, prompt_set: PromptSet, shards: list[ShardResult], repeats: int,
                  adapter: Path, head: Path) -> dict[str, Any]:
    """results.json (schema: `peftbd.benchmarking.schema`) from the workers' measurements."""
    d, first = cfg.decoding, shards[0]
    category_of = {p.id: p.category for p in prompt_set.prompts}
    results = {
        "schema": SCHEMA, "preset": cfg.preset,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "measured_on": {"model": cfg.model.name_or_path, "engine": first.engine,
                        "hardware": first.hardware,
                        "device": first.device, "dtype": first.dtype},
        "prompts": {"source": prompt_set.source, "path": prompt_set.path,
                    "count": len(prompt_set.prompts), "max_new_tokens": d.max_new_tokens,
                    "categories": prompt_set.categories(), "dropped": prompt_set.dropped},
        "timing": {
            "workers": len(shards), "torch_threads": d.torch_threads, "repeats": repeats,
            "worker_num_cpus": d.worker_num_cpus, "worker_num_gpus": d.worker_num_gpus,
            "how": "prompts split round-robin over the workers (Ray tasks); each worker times its "
                   "prompts one at a time (batch 1); per repeat the arms take turns over all "
                   "prompts after one untimed warm-up decode each; throughput = tokens / summed "
                   "per-prompt decode time.",
            "per_worker_hardware": [s.hardware for s in shards],
            "per_worker_peak_rss_mib": [s.peak_rss_mib for s in shards],
        },
        "drafters": {ADAPTER: _drafter_info(adapter), MTP_HEAD: _drafter_info(head)},
        "arms": arm_entries(arm_specs(cfg), shards, category_of),
        "config": cfg.to_dict(),
    }
    add_oracles(results)
    return results


def stage_stats(timer: StageTimer, shards: list[ShardResult]) -> dict[str, Any]:
    """Wall time, and peak memory as the max over the driver and the timing workers (where the
    models live)."""
    stats = timer.stats()
    gpu = [s.peak_gpu_mib for s in shards if s.peak_gpu_mib is not None]
    return {**stats, "peak_rss_mib": max([stats["peak_rss_mib"], *(s.peak_rss_mib for s in shards)]),
            "peak_gpu_mib": max(gpu) if gpu else None, "driver_peak_rss_mib": stats["peak_rss_mib"]}


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
    adapter = _require(artifacts, ADAPTER, f"train it with python -m jobs.train_peftbd --out "
                                           f"{artifacts / ADAPTER}")
    head = _require(artifacts, MTP_HEAD, f"train it with python -m jobs.train_mtp --out "
                                         f"{artifacts / MTP_HEAD}")
    prompt_set = load_prompts(cfg, artifacts, prompts)
    init_ray()
    log.info("benchmark: %d prompts x %d arms x %d repeats on %d worker(s)",
             len(prompt_set.prompts), len(arm_specs(cfg)), repeats, cfg.decoding.workers)
    shards = time_on_workers(cfg, adapter / ADAPTER_DIR, head / MTP_HEAD_DIR, prompt_set, repeats)
    results = build_results(cfg, prompt_set, shards, repeats, adapter, head)
    stats = stage_stats(timer, shards)  # the same numbers in the report and in manifest.json
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
    parser.add_argument("--artifacts", type=Path, required=True,
                        help="the main job's output root (holds continuations/, peftbd_adapter/, "
                             "mtp_head/)")
    parser.add_argument("--prompts", nargs="+", default=["test"], metavar="test | spec-bench PATH",
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
    if args.prompts == ["test"]:
        prompts, default_out = "test", args.artifacts / BENCHMARK
    elif len(args.prompts) == 2 and args.prompts[0] == "spec-bench":
        prompts, default_out = f"{SPEC_BENCH_PREFIX}{args.prompts[1]}", args.artifacts / f"{BENCHMARK}-spec-bench"
    else:
        parser.error(f"--prompts {' '.join(args.prompts)}: use 'test' or 'spec-bench PATH'")
    try:
        out = run_benchmark(cfg, args.artifacts, args.out or default_out, prompts, args.repeats)
    except (BenchmarkInputError, SourceError, ModelUnavailableError) as exc:
        sys.exit(f"error: {exc}")
    results = json.loads((out / RESULTS).read_text())
    print("\n".join(summary_lines(results)))
    print(f"benchmark report: {(out / REPORT).resolve()}")


if __name__ == "__main__":
    # Run from the importable module, so Ray pickles `jobs.benchmark.*` by reference, not `__main__`.
    from jobs.benchmark import main as _main

    _main()
