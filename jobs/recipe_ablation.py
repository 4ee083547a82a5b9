"""The DFlash recipe ablation: DFlash trained again with each of its recipe changes reverted to
today's head recipe, one at a time (leave-one-out), on the main job's artifact; what each change
buys in accepted tokens per round (`peftbd.analysis.recipe_ablation`).

    python -m jobs.pipeline && python -m jobs.recipe_ablation      # beside the main job's outputs
    python -m jobs.pipeline                                         # the report now shows it

Each variant is a `train_dflash` run (Ray Train + DeepSpeed) under `<out>.runs/<change>/`, kept
across reruns, so an interrupted ablation resumes where it stopped. The table goes to
ablation.md and ablation.json, its rows to the manifest; the main job's report shows them when this
output sits under its root.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Any

from jobs.ray_env import shutdown
from jobs.train_common import train_call
from peftbd.analysis.recipe_ablation import ablation_markdown, ablation_rows, differing, reverted
from peftbd.cli import add_config_args, add_stage_args, config_from_args, output_root, run_stage_job, stage_out
from peftbd.config import Config, ConfigError
from peftbd.layout import GENERATE, recipe_ablation_stage
from peftbd.manifest import is_complete, read_manifest
from peftbd.methods.bd_head import TRAIN_HEAD
from peftbd.methods.dflash import METHOD as DFLASH
from peftbd.methods.dflash import TRAIN_DFLASH
from peftbd.stage import StageCall, StageError, StageInputs


def ablation_call(cfg: Config, root: str | Path, out_dir: str | Path) -> StageCall:
    """The ablation as a stage over the main job's outputs under `root` (the artifact, the head
    and DFlash), writing `out_dir`."""
    upstream = {s.name: Path(root).resolve() / s.subdir for s in (GENERATE, TRAIN_HEAD, TRAIN_DFLASH)}
    missing = [f"{name} ({path})" for name, path in upstream.items() if not is_complete(path)]
    if missing:
        raise StageError(f"the ablation needs the main job's {', '.join(missing)}; run "
                                 f"python -m jobs.pipeline with the same preset and --out first")
    if not differing(cfg.dflash, cfg.peftbd_head):
        raise ConfigError("config keys dflash.feature_rule, block_masks, loss_decay, anchors, "
                          "anchor_fusion and anchored equal peftbd_head's: nothing to ablate; keep "
                          "DFlash's recipe in dflash")
    build = functools.partial(_build, cfg=cfg, upstream=upstream, runs=Path(f"{Path(out_dir).resolve()}.runs"))
    return StageCall(recipe_ablation_stage(), cfg.to_dict(), Path(out_dir).resolve(), upstream, build)


def _build(tmp: Path, inputs: StageInputs, cfg: Config, upstream: dict[str, Path],
           runs: Path) -> dict[str, Any]:
    variants: dict[str, Path] = {}
    for field in differing(cfg.dflash, cfg.peftbd_head):
        variant = cfg.with_section(DFLASH.id, reverted(cfg.dflash, cfg.peftbd_head, field))
        variants[field] = runs / field
        train_call(DFLASH.recipe, variant, upstream[GENERATE.name], variants[field],
                   spec=TRAIN_DFLASH).run()
    rows = ablation_rows(read_manifest(upstream[TRAIN_DFLASH.name]),
                         read_manifest(upstream[TRAIN_HEAD.name]),
                         {field: read_manifest(path) for field, path in variants.items()})
    table = ablation_markdown(rows)
    (tmp / "ablation.md").write_text(f"# DFlash recipe ablation\n\n{table}\n")
    (tmp / "ablation.json").write_text(json.dumps([r.to_dict() for r in rows], indent=2))
    return {"rows": [r.to_dict() for r in rows],
            "variants": {field: str(path) for field, path in variants.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.recipe_ablation",
                                     description=__doc__.split("\n\n")[0])
    add_config_args(parser)
    parser.add_argument("--artifacts", type=Path, default=None, metavar="ROOT",
                        help="the main job's output root (default: <paths.out_dir>/<preset>)")
    add_stage_args(parser, recipe_ablation_stage())
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    root = args.artifacts or output_root(cfg)
    out = stage_out(args, cfg, recipe_ablation_stage())
    run_stage_job(recipe_ablation_stage(), out, lambda: ablation_call(cfg, root, out), args.force,
                  args.verbose, before_exit=shutdown)
    print((out / "ablation.md").read_text())


if __name__ == "__main__":
    main()
