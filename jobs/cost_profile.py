"""Cost profile stage: one round of every arm, timed at the paper's architecture.

    python -m jobs.cost_profile                                    # Qwen3-0.6B shape, CPU fp32, ~1.5 min
    python -m jobs.cost_profile --set cost_profile.dtypes=[float32,bfloat16] --set cost_profile.kv_len=1024
    python -m jobs.cost_profile --set cost_profile.architecture=/models/Qwen3-0.6B   # a local copy
    python -m jobs.cost_profile --set cost_profile.architecture=model --set \\
        cost_profile.early_exit_layers=1                           # the tiny verifier itself
    ray job submit --working-dir . -- python -m jobs.cost_profile --preset qwen3-0.6b   # bf16, GPU

Builds `cost_profile.architecture` (random weights unless a local copy has them; no network),
attaches every benchmark arm's drafter as the benchmark does, and times one round of each with
the engine's own code at `cost_profile.kv_len` tokens of KV: the round's draft forwards, the
verify forward over the proposal + 1, and the AR step, per dtype in `cost_profile.dtypes`. It
also counts each round's FLOPs and bytes (a roofline bound for `cost_profile.roofline_gpu`) and
times the mask row's two paths. Runs as one Ray task (`cost_profile.num_gpus` GPUs); writes
`cost_profile.json`, which the benchmark's report reads ("Cost at the paper's architecture").
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray

from jobs.ray_env import init_ray, shutdown
from jobs.resources import wait_for_resources
from peftbd.benchmarking.cost_profile import run_profile, summary_lines
from peftbd.benchmarking.cost_profile_schema import PROFILE_FILE, CostProfile
from peftbd.benchmarking.cost_profile_models import preflight
from peftbd.cli import add_config_args, add_stage_args, config_from_args, run_stage_job, stage_out
from peftbd.config import Config
from peftbd.layout import cost_profile_stage
from peftbd.manifest import WorkerPeaks
from peftbd.stage import StageCall, StageInputs


def profile_on_ray(cfg: Config) -> CostProfile:
    """Run the profile as one Ray task with the CPUs its threads use and `num_gpus` GPUs, in a
    worker process of its own (`max_calls=1`): its model's memory goes with it, and no later
    task (the benchmark's timing workers) inherits its peak RSS."""
    init_ray()
    cp = cfg.cost_profile
    resources = {"CPU": float(max(1, cp.threads)), "GPU": cp.num_gpus}
    wait_for_resources("cost profile (1 task)", [resources])
    task = ray.remote(num_cpus=resources["CPU"], num_gpus=cp.num_gpus, max_calls=1)(run_profile)
    return ray.get(task.remote(cfg))


def cost_profile_call(cfg: Config, out_dir: str | Path) -> StageCall:
    """The cost profile as a stage (`peftbd.layout.COST_PROFILE`) writing `out_dir`; its settings
    are checked against the architecture now, before Ray starts. The architecture's identity (its
    config, where it came from, its weights) is an input of its own: `cost_profile.architecture`
    names it (`model`: the run's verifier; a directory whose config.json can change), it does
    not fix it."""
    arch = preflight(cfg)
    identity = {"name": arch.name, "origin": arch.origin, "weights": arch.weights,
                "config": json.loads(arch.config.to_json_string())}

    def build(tmp: Path, _inputs: StageInputs) -> dict[str, Any]:
        profile = profile_on_ray(cfg)
        (tmp / PROFILE_FILE).write_text(json.dumps(profile.to_dict(), indent=2))
        workers = WorkerPeaks(1, profile.peak_rss_mib, profile.peak_gpu_mib, "+".join(profile.profiles))
        return {"summary": summary_lines(profile), "profile_seconds": profile.seconds,
                "workers": workers.to_dict()}

    return StageCall(cost_profile_stage(), cfg.to_dict(), Path(out_dir), {}, build,
                     {"architecture": identity})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.cost_profile",
                                     description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    stage = cost_profile_stage()
    add_stage_args(parser, stage)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    out = stage_out(args, cfg, stage)
    # plain ValueErrors too (as before UserError): one line each
    run_stage_job(stage, out, lambda: cost_profile_call(cfg, out), args.force, args.verbose,
                  (ValueError,), before_exit=shutdown)
    print("\n".join(summary_lines(CostProfile.read(out / PROFILE_FILE))))
    print(f"wrote {out / PROFILE_FILE} and {out / 'manifest.json'}")


if __name__ == "__main__":
    main()
