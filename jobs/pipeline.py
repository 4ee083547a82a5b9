"""The main job: tiny world -> generate -> train the drafters (PEFT-BD, FastMTP, the block-diffusion
head, DFlash; --preset tiny-full adds PEFT-BD's early-exit and offsets ablations) -> cost profile
-> benchmark -> report.

    python -m jobs.pipeline                      # the embedded tiny world, CPU, no network
    python -m jobs.pipeline --set peftbd.lora_r=4 --dry-run   # what would rerun, and why
    python -m jobs.pipeline --preset qwen3-0.6b --out /shared/peftbd   # the paper, on a cluster
    ray job submit --working-dir . -- python -m jobs.pipeline --preset qwen3-0.6b --out ...

Every stage declares what it reads (`peftbd.layout`): config values, upstream artifacts, code.
Before anything runs, the job prints its plan: a stage is skipped only when its output is
complete for exactly these inputs; otherwise it reruns, and so does everything that consumes it.
A rerun after a failure resumes where it stopped. At the end it prints where everything went.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from peftbd.budgets import MAIN_JOB, Check, main_job_check, record
from peftbd.cli import LOGS, add_config_args, add_verbose_arg, config_from_args, output_root
from peftbd.config import Config
from peftbd.layout import GENERATE, WORLD, benchmark_stage, cost_profile_stage, experiments, stages
from peftbd.console import Console
from peftbd.main_job_checks import check_main_job
from peftbd.manifest import StageTimer, is_complete, read_manifest, versions, write_manifest
from peftbd.methods import methods
from peftbd.output_lock import check_writable
from peftbd.stage import Decision, StageCall, StageError


def stage_calls(cfg: Config, root: Path) -> list[StageCall]:
    """The main job as a recipe: each stage with its output dir under `root` and, explicitly,
    the artifacts it consumes. The world only when the model or data is the embedded tiny world;
    each registered method's training stages (`Method.training_stages`: PEFT-BD's early-exit
    adapter only when `peftbd.early_exit_layers` > 0, its offsets ablation only with
    `peftbd.offsets_ablation`); the placement experiment's output (never run here) as an
    input of the benchmark when it exists under `root`."""
    from jobs.benchmark import benchmark_call
    from jobs.cost_profile import cost_profile_call
    from jobs.generate import generate_call
    from jobs.train_common import train_call
    from peftbd.tiny_world.build import uses_tiny_world, world_call

    calls: dict[str, StageCall] = {}
    world = None
    if uses_tiny_world(cfg):
        calls[WORLD.name] = world_call(cfg.tiny_world, cfg.paths.cache_dir)
        world = calls[WORLD.name].out
    calls[GENERATE.name] = generate_call(cfg, root / GENERATE.subdir, world=world)
    data = calls[GENERATE.name].out
    for method in methods():  # every registered drafter's training stages
        for spec, stage_cfg in method.training_stages(cfg):
            calls[spec.name] = train_call(method.recipe, stage_cfg, data, root / spec.subdir, spec=spec)
    profile, bench = cost_profile_stage(), benchmark_stage()
    calls[profile.name] = cost_profile_call(cfg, root / profile.subdir)
    inputs = {name: call.out for name, call in calls.items() if name in bench.input_names}
    for experiment in experiments():  # run beside the main job: the report shows them
        if is_complete(root / experiment.subdir):
            inputs[experiment.name] = root / experiment.subdir
    calls[bench.name] = benchmark_call(cfg, inputs, root / bench.subdir)
    return list(calls.values())


def plan(calls: list[StageCall], force: set[str]) -> list[Decision]:
    """Each stage's decision, in order: forced, or downstream of a stage that reruns, or as its
    output and inputs say (`StageCall.decide`)."""
    rerun: set[str] = set()
    decisions = []
    for call in calls:
        name = call.spec.name
        stale = [u for u in call.upstream if u in rerun]
        if name in force:
            decision = Decision(True, ("forced",))
        elif stale:
            decision = Decision(True, tuple(f"input {u} reruns" for u in stale))
        else:
            try:
                decision = call.decide()
            except StageError as exc:
                raise StageError(f"stage {name}: {exc} (here: python -m jobs.pipeline --force {name})") from exc
        if decision.run:
            rerun.add(name)
        decisions.append(decision)
    return decisions


def forced_stages(names: list[str], start: str | None, calls: list[StageCall]) -> set[str]:
    """--force names plus, with --from, that stage and every stage after it."""
    order = [c.spec.name for c in calls]
    for name in [*names, *([start] if start else [])]:
        if name not in order:
            raise StageError(f"stage {name!r} is not part of this run; its stages: {', '.join(order)}")
    return set(names) | (set(order[order.index(start):]) if start else set())


def run_pipeline(cfg: Config, out_dir: Path, force: AbstractSet[str] = frozenset(), start: str | None = None,
                 dry_run: bool = False, console: Console | None = None) -> dict[str, Any]:
    """Plan the stages under `out_dir`, show the plan, run those that must run; return the
    pipeline manifest (also written to `out_dir/manifest.json` unless `dry_run`). Library and Ray
    output goes to `console`'s per-stage log files (none: a verbose console, the terminal)."""
    from jobs.ray_env import init_ray

    check_main_job(cfg)  # split sizes its stages cannot use: refused before any stage runs
    console = console or Console(out_dir / LOGS, verbose=True)
    timer = StageTimer()
    calls = stage_calls(cfg, out_dir)
    decisions = plan(calls, forced_stages(sorted(force), start, calls))
    width = max(len(c.spec.name) for c in calls)
    console.line(f"[pipeline] plan for {out_dir.resolve()}:")
    for call, decision in zip(calls, decisions):
        verdict = "RUN " if decision.run else "skip"
        console.line(f"  {call.spec.name:<{width}}  {verdict}  {decision.describe()}")
    if dry_run:
        return {"plan": _plan_rows(calls, decisions)}
    out_dir.mkdir(parents=True, exist_ok=True)
    for i, (call, decision) in enumerate(zip(calls, decisions), 1):
        prefix = f"[pipeline {i}/{len(calls)}] {call.spec.title}"
        if not decision.run:
            console.line(f"{prefix}: current, skipped ({call.out})")
            continue
        log_path = console.log_path(call.spec.name)
        console.line(f"{prefix}: running -> {call.out}" + (f" (log: {log_path})" if log_path else ""))
        start_s = time.perf_counter()
        with console.stage(call.spec.name, call.spec.title):
            if call.spec is not WORLD:
                init_ray()
            call.run(decision=decision)
        console.line(f"{prefix}: done in {time.perf_counter() - start_s:.1f}s")
    rows = []
    for row, call in zip(_plan_rows(calls, decisions), calls):
        m = read_manifest(call.out)
        rows.append({**row, "wall_seconds": m.get("wall_seconds"), "peak_rss_mib": m.get("peak_rss_mib"),
                     "peak_gpu_mib": m.get("peak_gpu_mib"), "workers": m.get("workers")})
    manifest = {"preset": cfg.preset, "config": cfg.to_dict(), "versions": versions(),
                "stages": rows, **timer.stats()}
    budget = main_job_check(cfg, manifest["wall_seconds"], [d.run for d in decisions])
    manifest["budget"] = budget.manifest_section()
    write_manifest(out_dir, manifest)
    record(budget, cfg.paths.cache_dir)
    return manifest


def _plan_rows(calls: list[StageCall], decisions: list[Decision]) -> list[dict[str, Any]]:
    return [{"stage": c.spec.name, "title": c.spec.title, "path": str(c.out), "ran": d.run,
             "reasons": list(d.reasons)} for c, d in zip(calls, decisions)]


def main(argv: list[str] | None = None) -> None:
    width = max(len(s.name) for s in stages())
    parser = argparse.ArgumentParser(
        prog="python -m jobs.pipeline",
        description=__doc__.split("\n\n")[0],
        epilog="Stages, in order, each with the command that runs it alone (the world runs only for\n"
        "the embedded tiny world; train_peftbd_early_exit only when peftbd.early_exit_layers > 0,\n"
        "train_peftbd_offsets only with peftbd.offsets_ablation; a methods.plugins method adds its own):\n"
        + "\n".join(f"  {s.name:<{width}}  {s.command}" for s in stages()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(parser)
    parser.add_argument("--out", type=Path, default=None,
                        help="output root (default: <paths.out_dir>/<preset>, i.e. outputs/tiny)")
    parser.add_argument("--force", action="append", default=[], metavar="STAGE", help="rerun STAGE although it is current (and so "
                        "everything that consumes it); repeatable")
    parser.add_argument("--from", dest="start", default=None, metavar="STAGE",
                        help="rerun STAGE and every stage after it")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (what would run, and why) and exit")
    add_verbose_arg(parser)
    args = parser.parse_args(argv)
    cfg = config_from_args(args, ready_process=False)  # the world is a stage of its plan
    out = args.out or output_root(cfg)
    from jobs.ray_env import shutdown
    from peftbd.cli import exit_on_user_error
    from peftbd.errors import UserError, error_line

    # what the stages raise with a message that names the fix (a UserError, also from a Ray
    # task, actor or training worker): one line `error: ...`, no traceback
    try:
        check_writable(out / LOGS)  # before the log dir and before Ray starts
    except UserError as exc:
        sys.exit(error_line(exc))
    with Console(out / LOGS, args.verbose, before_exit=shutdown) as console:
        try:
            manifest = run_pipeline(cfg, out, set(args.force), args.start, args.dry_run, console)
        except Exception as exc:
            exit_on_user_error(exc)
            raise
        if args.dry_run:
            return
        total = Check(MAIN_JOB, manifest["wall_seconds"], manifest["budget"]["complete_run"])
        console.line(f"\npeftbd pipeline ({cfg.preset}) finished: total {total.describe()}; "
                     f"outputs under {out.resolve()} (logs: {(out / LOGS).resolve()}):")
        for row in manifest["stages"]:
            console.line(f"  {row['title']:<34} {row['path']}")
        bench = out / benchmark_stage().subdir
        console.line(f"\nreport: {(bench / 'report.md').resolve()}")
        for line in read_manifest(bench).get("summary", []):
            console.line(f"  {line}")


if __name__ == "__main__":
    main()
