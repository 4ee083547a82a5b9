"""The acceptance study: what decides a drafter's acceptance on the tiny world, one suspect at a
time: the verifier's depth (about equal parameters), the drafters' training budget, and content
(read per category of every variant's held-out rows).

    python -m jobs.acceptance_study                               # base, depth 4 and 8, budget 4x
    python -m jobs.acceptance_study --depths 2,4 --budgets 1,2    # fewer variants
    python -m jobs.acceptance_study --methods peftbd,fastmtp

A variant runs the main job's own stages (world, generate, every drafter's training) under
`--set` overrides: the base is the main job's output root itself (a finished main job is reused;
`--artifacts`), every other variant lives under `<out>.runs/<variant>/`, kept across reruns
with the main job's skip rule, so an interrupted study resumes where it stopped. Each drafter is
then replayed on the held-out val + test rows per category (`peftbd.benchmarking.acceptance_study`);
study.md, study.json and study.png go to --out (default outputs/<preset>/acceptance_study).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

from jobs.benchmark import drafter_dirs
from jobs.pipeline import plan, stage_calls
from jobs.ray_env import init_ray, shutdown
from peftbd.analysis.acceptance_study import deciding_paragraph, mix_table, study_figure, study_markdown
from peftbd.benchmarking.acceptance_study import Study, Variant, VariantFacts, replay_cells, variants
from peftbd.cli import add_config_args, add_stage_args, config_from_args, output_root, run_stage_job, stage_out
from peftbd.config import Config, ConfigError, apply_override
from peftbd.layout import GENERATE, WORLD, acceptance_study_stage
from peftbd.manifest import read_manifest
from peftbd.methods import Method, methods
from peftbd.stage import StageCall, StageInputs
from peftbd.tiny_world.build import uses_tiny_world


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _methods(text: str) -> list[Method]:
    known = {m.id: m for m in methods()}
    unknown = [x for x in text.split(",") if x not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown)}: not a registered method; "
                                         f"choose from {','.join(known)}")
    return [known[x] for x in text.split(",")]


def run_variant(cfg: Config, root: Path, chosen: list[Method]) -> dict[str, Path]:
    """The world, the artifact and `chosen` methods' trainings of `cfg` under `root`, each run
    unless current (the main job's plan); {stage name: output dir}."""
    names = {WORLD.name, GENERATE.name} | {s.name for m in chosen for s, _ in m.training_stages(cfg)}
    calls = [c for c in stage_calls(cfg, root) if c.spec.name in names]
    for call, decision in zip(calls, plan(calls, set())):
        if decision.run:
            if call.spec is not WORLD:
                init_ray()
            call.run(decision=decision)
    return {c.spec.name: c.out for c in calls}


def _facts(variant: Variant, cfg: Config, outs: dict[str, Path]) -> VariantFacts:
    world = read_manifest(outs[WORLD.name])
    return VariantFacts(
        variant=variant, layers=cfg.tiny_world.num_layers, hidden_size=cfg.tiny_world.hidden_size,
        parameters=world["parameters"], world_steps=world.get("train_steps", cfg.tiny_world.train_steps),
        heldout_loss=round(world["heldout_loss_nats"], 4),
        drafter_steps={name: read_manifest(path)["config"][name_section]["optim"]["max_steps"]
                       for name, path, name_section in _trained(cfg, outs)})


def _trained(cfg: Config, outs: dict[str, Path]) -> list[tuple[str, Path, str]]:
    return [(s.name, outs[s.name], m.section) for m in methods() for s, _ in m.training_stages(cfg)
            if s.name in outs]


def _build(tmp: Path, inputs: StageInputs, cfg: Config, base_root: Path, runs: Path,
           chosen: list[Method], depths: list[int], budgets: list[float]) -> dict[str, Any]:
    facts: list[VariantFacts] = []
    cells = []

    def measure(variant: Variant) -> None:
        vcfg = functools.reduce(apply_override, variant.overrides, cfg)
        outs = run_variant(vcfg, base_root if variant.name == "base" else runs / variant.name, chosen)
        dirs, _ = drafter_dirs(vcfg, outs)
        facts.append(_facts(variant, vcfg, outs))
        cells.extend(replay_cells(vcfg, variant.name, outs[GENERATE.name], dirs))

    base, *_ = variants(cfg, chosen, [], [])
    measure(base)  # first: the deeper worlds train to its held-out loss
    for variant in variants(cfg, chosen, depths, budgets, heldout_loss=facts[0].heldout_loss)[1:]:
        measure(variant)
    study = Study(facts, cells)
    (tmp / "study.json").write_text(study.to_json())
    (tmp / "study.md").write_text(study_markdown(study))
    study_figure(study, tmp / "study.png")
    return {"variants": [f.variant.name for f in facts], "cells": len(cells),
            "mix_table": mix_table(study), "deciding": deciding_paragraph(study)}


def study_call(cfg: Config, base_root: Path, out: Path, chosen: list[Method], depths: list[int],
               budgets: list[float]) -> StageCall:
    """The study as a stage writing `out` (its variants' own runs beside it, `<out>.runs/`)."""
    if not uses_tiny_world(cfg):
        raise ConfigError("the acceptance study varies the embedded tiny world: run it with "
                         "model.name_or_path and data.source embedded:tiny (--preset tiny)")
    out = out.resolve()
    build = functools.partial(_build, cfg=cfg, base_root=base_root.resolve(),
                              runs=Path(f"{out}.runs"), chosen=chosen, depths=depths, budgets=budgets)
    extra = {"methods": [m.id for m in chosen], "depths": depths, "budgets": budgets}
    return StageCall(acceptance_study_stage(), cfg.to_dict(), out, {}, build, extra)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.acceptance_study",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--artifacts", type=Path, default=None, metavar="ROOT",
                        help="the base variant's root: the main job's (default: "
                        "<paths.out_dir>/<preset>); its finished stages are reused")
    parser.add_argument("--depths", type=_ints, default=[2, 4, 8], metavar="L,L",
                        help="verifier depths, each at about the default's parameters (default 2,4,8)")
    parser.add_argument("--budgets", type=_floats, default=[1.0, 4.0], metavar="X,X",
                        help="training budget multiples of every drafter's steps (default 1,4)")
    parser.add_argument("--methods", type=_methods, default=None, metavar="ID,ID",
                        help=f"drafting methods to train and replay (default: all registered: "
                        f"{','.join(m.id for m in methods())})")
    add_stage_args(parser, acceptance_study_stage())
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    chosen = args.methods or list(methods())
    out = stage_out(args, cfg, acceptance_study_stage())
    base = args.artifacts or output_root(cfg)
    run_stage_job(acceptance_study_stage(), out,
                  lambda: study_call(cfg, base, out, chosen, args.depths, args.budgets),
                  args.force, args.verbose, before_exit=shutdown)
    print((out / "study.md").read_text())


if __name__ == "__main__":
    main()
