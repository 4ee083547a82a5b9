"""The main job: tiny world -> generate -> train PEFT-BD (whole-backbone and early-exit) and MTP
-> benchmark -> report.

    python -m jobs.pipeline                      # the embedded tiny world, CPU, no network
    python -m jobs.pipeline --preset qwen3-0.6b --out /shared/peftbd   # the paper, on a cluster
    ray job submit --working-dir . -- python -m jobs.pipeline --preset qwen3-0.6b --out ...

Each stage writes its artifact under --out; a stage whose artifact is complete is skipped, so a
rerun after a failure resumes where it stopped. Prints one progress line per stage and, at the
end, where everything went.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from peftbd.cli import add_config_args, config_from_args
from peftbd.config import EMBEDDED_TINY, Config
from peftbd.layout import (
    ADAPTER,
    BENCHMARK,
    CONTINUATIONS,
    EARLY_EXIT,
    MTP_HEAD,
    STAGE_NAMES,
    WORLD,
)
from peftbd.manifest import StageTimer, is_complete, read_manifest, versions, write_manifest

log = logging.getLogger("peftbd.pipeline")


@dataclass(frozen=True)
class Stage:
    """One step of the main job: its name, output subdirectory and how to run it."""

    name: str
    subdir: str
    run: Callable[[Config, Path], Path]


def _world(cfg: Config, out: Path) -> Path:
    from peftbd.models.tiny_world import ensure_tiny_world

    timer = StageTimer()
    world = ensure_tiny_world(cfg)
    out.mkdir(parents=True, exist_ok=True)
    write_manifest(out, {"stage": "tiny_world", "path": str(world.root),
                         "world": world.manifest(), **timer.stats()})
    return world.root


def _generate(cfg: Config, out: Path) -> Path:
    from jobs.generate import run_generate

    return run_generate(cfg, out)


def _train_peftbd(cfg: Config, out: Path) -> Path:
    from jobs.train_peftbd import run_train_peftbd

    return run_train_peftbd(cfg, out.parent / CONTINUATIONS, out)


def _train_early_exit(cfg: Config, out: Path) -> Path:
    from jobs.train_peftbd import run_train_peftbd

    drafter = dataclasses.replace(cfg.drafter, draft_layers=cfg.drafter.early_exit_layers)
    return run_train_peftbd(dataclasses.replace(cfg, drafter=drafter), out.parent / CONTINUATIONS, out)


def _train_mtp(cfg: Config, out: Path) -> Path:
    from jobs.train_mtp import run_train_mtp

    return run_train_mtp(cfg, out.parent / CONTINUATIONS, out)


def _benchmark(cfg: Config, out: Path) -> Path:
    from jobs.benchmark import run_benchmark

    return run_benchmark(cfg, out.parent, out)


RUNS: dict[str, Callable[[Config, Path], Path]] = {
    WORLD: _world, CONTINUATIONS: _generate, ADAPTER: _train_peftbd,
    EARLY_EXIT: _train_early_exit, MTP_HEAD: _train_mtp, BENCHMARK: _benchmark,
}


def stages(cfg: Config) -> list[Stage]:
    """The stages this configuration runs, in order: the world only for the embedded tiny world,
    the early-exit adapter only when `drafter.early_exit_layers` > 0."""
    skip = set()
    if cfg.model.name_or_path != EMBEDDED_TINY:
        skip.add(WORLD)
    if cfg.drafter.early_exit_layers <= 0:
        skip.add(EARLY_EXIT)
    return [Stage(name, sub, RUNS[sub]) for sub, name in STAGE_NAMES.items() if sub not in skip]


def run_pipeline(cfg: Config, out_dir: Path) -> dict:
    """Run every stage not yet complete under `out_dir`; return the pipeline manifest."""
    from jobs.ray_env import init_ray

    out_dir.mkdir(parents=True, exist_ok=True)
    timer = StageTimer()
    todo = stages(cfg)
    table = []
    for i, stage in enumerate(todo, 1):
        target = out_dir / stage.subdir
        prefix = f"[pipeline {i}/{len(todo)}] {stage.name}"
        if is_complete(target):
            print(f"{prefix}: complete, skipped ({target})", flush=True)
        else:
            print(f"{prefix}: running -> {target}", flush=True)
            start = time.perf_counter()
            if stage.subdir != WORLD:
                init_ray()
            stage.run(cfg, target)
            print(f"{prefix}: done in {time.perf_counter() - start:.1f}s", flush=True)
        m = read_manifest(target)
        table.append({
            "stage": stage.name, "path": str(target),
            "wall_seconds": m.get("wall_seconds"),
            "peak_rss_mib": m.get("peak_rss_mib"), "peak_gpu_mib": m.get("peak_gpu_mib"),
        })
    manifest = {"preset": cfg.preset, "config": cfg.to_dict(), "versions": versions(),
                "stages": table, **timer.stats()}
    write_manifest(out_dir, manifest)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.pipeline",
        description=__doc__.split("\n\n")[0],
        epilog="Stages: tiny world (tiny preset only), generate, train_peftbd, train_peftbd with "
        "drafter.draft_layers=drafter.early_exit_layers (the early-exit adapter; skipped when that "
        "is 0), train_mtp, benchmark. Run one alone with python -m jobs.<stage> --help.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(parser)
    parser.add_argument("--out", type=Path, default=None,
                        help="output root (default: <paths.out_dir>/<preset>, i.e. outputs/tiny)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = config_from_args(args)
    out = args.out or Path(cfg.paths.out_dir) / cfg.preset
    manifest = run_pipeline(cfg, out)
    print(f"\npeftbd pipeline ({cfg.preset}) finished in {manifest['wall_seconds']:.0f}s; "
          f"outputs under {out.resolve()}:")
    for row in manifest["stages"]:
        print(f"  {row['stage']:<28} {row['path']}")
    bench = out / BENCHMARK
    print(f"\nreport: {(bench / 'report.md').resolve()}")
    for line in read_manifest(bench).get("summary", []):
        print(f"  {line}")


if __name__ == "__main__":
    sys.exit(main())
