"""Distil a drafting method's drafter from the continuation artifact with Ray Train + DeepSpeed.

    python -m jobs.train --method peftbd                  # the tiny world, outputs/tiny/peftbd
    python -m jobs.train --method fastmtp --data outputs/tiny/continuations --out /tmp/fastmtp
    python -m jobs.train --method peftbd --set peftbd.draft_layers=1 --out outputs/tiny/peftbd_early_exit
    ray job submit --working-dir . -- python -m jobs.train --method peftbd --preset qwen3-0.6b \\
        --data /shared/peftbd/continuations --out /shared/peftbd/peftbd

Any registered method that trains (`peftbd.methods`; a plugin's too, with `--set
methods.plugins=[my_pkg.my_drafter]`): its task, section (`<method>.optim`) and output dir
(`<paths.out_dir>/<preset>/<method>`) come from its declaration. Skipped when --out already
holds the result of the same artifact, config and code; a rerun resumes the latest checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from jobs.ray_env import shutdown
from jobs.train_common import train_call
from peftbd.cli import add_config_args, add_stage_args, config_from_args, output_root, run_stage_job
from peftbd.layout import GENERATE
from peftbd.manifest import read_manifest
from peftbd.methods import method, methods


def main(argv: list[str] | None = None) -> None:
    trained = [m for m in methods() if m.trains]
    parser = argparse.ArgumentParser(
        prog="python -m jobs.train", description=__doc__.split("\n\n")[0],
        epilog="Methods that train: " + "; ".join(f"{m.id} ({m.what})" for m in trained)
        + ". A methods.plugins method is named the same way.",
    )
    parser.add_argument("--method", required=True, metavar="NAME",
                        help=f"the method to train: {', '.join(m.id for m in trained)}, or a plugin's")
    add_config_args(parser)
    parser.add_argument("--data", type=Path, default=None, metavar="ARTIFACT_DIR",
                        help="continuation artifact (default: <paths.out_dir>/<preset>/continuations, where "
                             "python -m jobs.generate and the main job put it)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: <paths.out_dir>/<preset>/<method>, the main "
                             "job's layout)")
    add_stage_args(parser)
    parser.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                        help="continue the latest checkpoint of the run with these inputs "
                             "(default); --no-resume starts over")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)  # imports methods.plugins first: a plugin's method is known after
    try:
        m = method(args.method)
    except ValueError as exc:
        parser.error(f"--method: {exc}")
    if not m.trains or m.stage is None:
        parser.error(f"--method {m.id}: {m.what} has nothing to train (a model-free method)")
    spec = m.stage
    data = args.data or output_root(cfg) / GENERATE.subdir
    out = args.out or output_root(cfg) / spec.subdir
    run_stage_job(spec, out, lambda: train_call(m.recipe, cfg, data, out, resume=args.resume),
                  args.force or not args.resume, args.verbose, before_exit=shutdown)
    manifest = read_manifest(out)
    p = manifest["parameters"]
    untrained = (f"; UNTRAINED: {'; '.join(manifest['untrained_reasons'])}"
                 if manifest.get("untrained") else "")
    print(f"{spec.name}: {out} ({p['trainable']:,} trainable of {p['total']:,} parameters, "
          f"eval loss {manifest['metrics']['eval_loss']:.4f}, target-token accuracy "
          f"{manifest['metrics']['eval_target_token_accuracy']:.4f}, {manifest['wall_seconds']} s{untrained})")


if __name__ == "__main__":
    # Run from the importable module, so Ray pickles `jobs.train.*` by reference, not `__main__`.
    from jobs.train import main as _main

    _main()
