"""Benchmark of the generate stage: tokens/s for 1 vs 2 verifier actors and batch 1 vs batch B,
and with `--vllm` our engine vs vLLM (`generate.backend`) at 1 actor, batch B.

Runs `run_generate` several times on the same source rows (each into its own directory), reads
the throughput from each manifest, checks that every run produced the same continuation for
every shared row id, and records how loaded the machine was during each run.

    python -m jobs.generate_bench --preset tiny --out outputs/generate_bench
    python -m jobs.generate_bench --preset tiny --vllm   # needs scripts/install.sh --with-vllm
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import psutil

from jobs.generate import run_generate
from jobs.ray_env import init_ray
from peftbd.cli import add_config_args, config_from_args, exit_on_user_error
from peftbd.config import Config, apply_override
from peftbd.data.artifact import SPLITS, read_split
from peftbd.manifest import read_manifest, versions


def _continuations(artifact: Path) -> dict[str, list[int]]:
    return {r["id"]: r["continuation_ids"] for s in SPLITS
            for r in read_split(artifact, s).select(["id", "continuation_ids"]).to_pylist()}


def bench_run(cfg: Config, out: Path, actors: int, batch: int, limit: int | None,
              backend: str = "engine") -> dict[str, Any]:
    """One generate run on `backend` with `actors` actors at batch size `batch`: throughput and
    machine load."""
    for item in (f"generate.num_actors={actors}", f"generate.batch_size={batch}",
                 f"generate.backend={backend}"):
        cfg = apply_override(cfg, item)
    shutil.rmtree(out, ignore_errors=True)  # measure a fresh run, not a completed artifact
    psutil.cpu_percent(None)  # start the system-wide CPU utilisation window
    load_before = os.getloadavg()
    start = time.perf_counter()
    run_generate(cfg, out, limit=limit)
    tp = read_manifest(out)["throughput"]
    return {
        "backend": backend, "actors": actors, "batch_size": batch, "limit": limit,
        "rows": tp["generated_rows"], "tokens": tp["generated_tokens"],
        "rows_per_s": round(tp["generated_rows"] / max(tp["span_seconds"], 1e-9), 2),
        "stage_rows_per_s": round(tp["generated_rows"] / max(tp["stage_seconds"], 1e-9), 2),
        "tokens_per_s": tp["tokens_per_s"], "stage_tokens_per_s": tp["stage_tokens_per_s"],
        "tokens_per_cpu_s": tp["tokens_per_cpu_s"],
        "per_actor_tokens_per_s": [a["tokens_per_s"] for a in tp["per_actor"].values()],
        "run_seconds": round(time.perf_counter() - start, 1),
        "load": {"loadavg_1m_before": round(load_before[0], 2),
                 "loadavg_1m_after": round(os.getloadavg()[0], 2),
                 "system_cpu_percent": psutil.cpu_percent(None)},
    }


def run_bench(cfg: Config, out_dir: Path, rows: int | None, batch1_rows: int,
              vllm: bool = False) -> dict[str, Any]:
    """The engine's four runs, with `vllm` a vLLM run, and their ratios; every artifact kept
    under `out_dir` for inspection."""
    init_ray()
    batch = cfg.generate.batch_size
    runs: dict[str, tuple[int, int, int | None, str]] = {
        "1_actor_batch_1": (1, 1, batch1_rows, "engine"),
        f"1_actor_batch_{batch}_small": (1, batch, batch1_rows, "engine"),
        f"1_actor_batch_{batch}": (1, batch, rows, "engine"),
        f"2_actors_batch_{batch}": (2, batch, rows, "engine"),
    }
    if vllm:
        runs[f"vllm_1_actor_batch_{batch}"] = (1, batch, rows, "vllm")
    results = {name: bench_run(cfg, out_dir / name, *spec) for name, spec in runs.items()}
    outputs = [_continuations(out_dir / name) for name in runs]
    identical = all(
        o[i] == outputs[0][i] for o in outputs[1:] for i in outputs[0].keys() & o.keys()
    )
    r = {name: res["tokens_per_s"] for name, res in results.items()}
    cpu = {name: res["tokens_per_cpu_s"] for name, res in results.items()}
    versus = {} if not vllm else {
        "vllm_over_engine_rows_per_s": round(results[f"vllm_1_actor_batch_{batch}"]["rows_per_s"]
                                              / results[f"1_actor_batch_{batch}"]["rows_per_s"], 2),
        "vllm_over_engine_stage_rows_per_s": round(
            results[f"vllm_1_actor_batch_{batch}"]["stage_rows_per_s"]
            / results[f"1_actor_batch_{batch}"]["stage_rows_per_s"], 2)}
    return {
        "metric": "tokens_per_s: generated tokens / seconds from the first batch start to the last "
                  "batch end (actor start-up excluded; stage_tokens_per_s includes it); "
                  "tokens_per_cpu_s: generated tokens / CPU-seconds of the actors (efficiency, "
                  "insensitive to other processes competing for the cores)",
        "runs": results,
        "two_actors_over_one": round(r[f"2_actors_batch_{batch}"] / r[f"1_actor_batch_{batch}"], 2),
        f"batch_{batch}_over_batch_1": round(r[f"1_actor_batch_{batch}_small"]
                                             / r["1_actor_batch_1"], 2),
        f"batch_{batch}_over_batch_1_per_cpu_s": round(cpu[f"1_actor_batch_{batch}_small"]
                                                       / cpu["1_actor_batch_1"], 2),
        "identical_continuations_across_runs": identical,
        **versus,
        "machine": {"logical_cpus": os.cpu_count(),
                    "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)},
        "config": dataclasses.asdict(cfg.generate) | {"max_new_tokens": cfg.data.max_new_tokens},
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.generate_bench", description=__doc__)
    add_config_args(parser)
    parser.add_argument("--rows", type=int, default=None,
                        help="source rows for the 1-vs-2-actor runs (default: the whole plan)")
    parser.add_argument("--batch1-rows", type=int, default=256,
                        help="source rows for the batch-1-vs-batch-B runs (batch 1 is slow)")
    parser.add_argument("--vllm", action="store_true",
                        help="also a vLLM run (generate.backend=vllm, 1 actor, batch B) beside the "
                             "engine's (needs scripts/install.sh --with-vllm)")
    parser.add_argument("--out", default="outputs/generate_bench", help="output directory")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = config_from_args(args)
    try:
        result = run_bench(cfg, out, args.rows, args.batch1_rows, args.vllm)
    except Exception as exc:
        exit_on_user_error(exc)  # one line `error: ...` for what the user can fix
        raise
    path = out / "generate_bench.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"generate bench: {path.resolve()} (2 actors / 1 = {result['two_actors_over_one']}x, "
          f"{next(v for k, v in result.items() if k.endswith('_over_batch_1'))}x batched / "
          f"batch 1; load {result['runs']['1_actor_batch_1']['load']})")


if __name__ == "__main__":
    from jobs.generate_bench import main as _main  # importable names for Ray's pickling

    _main()
