"""The peer table: our engine beside vLLM in one run, `python -m jobs.peer` (vLLM from
`bash scripts/install.sh --with-vllm`). What it measures: `peftbd.benchmarking.peer`, in one Ray
task of `PEER_CPUS` CPUs, so on a node with vLLM and the cores to itself (a submitted job's
driver runs on the head, which has neither: `jobs.vllm_node`). Writes `<out>/peer.json`,
`peer.md` and `manifest.json` (default `outputs/<preset>/peer`, where the benchmark's report
finds it) and, given the main job's trained DFlash head, its vLLM export in `<out>/dflash_vllm/`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

import ray

from jobs.ray_env import init_ray
from jobs.resources import wait_for_resources
from jobs.vllm_node import vllm_where
from peftbd.analysis.peer import PEER_KEY, markdown
from peftbd.benchmarking.peer import PeerSettings, ShapeDtype, run
from peftbd.benchmarking.peer_schema import PeerPath, PeerTable
from peftbd.cli import add_config_args, add_stage_args, config_from_args, output_root, run_stage_job, stage_out
from peftbd.config import Config
from peftbd.data.sources import source_identity
from peftbd.layout import peer_stage
from peftbd.manifest import is_complete
from peftbd.methods.dflash import TRAIN_DFLASH
from peftbd.peers.vllm_client import VllmError
from peftbd.stage import StageCall, StageInputs


EXPORT_SUBDIR = "dflash_vllm"
PEER_CPUS = 2
"""The peer task's CPUs: each engine times on one thread, the two take turns, and nothing else
lands beside them on a 2-core box."""


def trained_dflash(root: Path) -> tuple[Path | None, str | None]:
    """(the finished DFlash training run under the main job's output `root`, None) or (None, why
    there is none)."""
    path = root / TRAIN_DFLASH.subdir
    if is_complete(path):
        return path, None
    return None, (f"no finished DFlash training in {path}: run python -m jobs.pipeline (or "
                  "jobs.train --method dflash) with this preset first, or pass --artifacts ROOT")


def peer_call(cfg: Config, settings: PeerSettings, out_dir: Path, root: Path) -> StageCall:
    """The peer run as a stage (`peftbd.layout.peer_stage`) writing `out_dir`; with the main
    job's trained DFlash head under `root`, that head in both engines too."""
    dflash, absent = trained_dflash(root)

    def build(tmp: Path, _inputs: StageInputs) -> dict[str, Any]:
        head = None if dflash is None else (dflash, tmp / EXPORT_SUBDIR)
        wait_for_resources("the peer run", [{"CPU": PEER_CPUS}])
        task = ray.remote(run).options(num_cpus=PEER_CPUS)
        try:  # Ray's overloads type `run` (one argument defaulted) as three-ary
            table: PeerTable = ray.get(task.remote(cfg, settings, out_dir.parent / "logs", head))  # type: ignore[call-arg]
        except ray.exceptions.RayTaskError as exc:  # the measurement's own error, not Ray's wrapper
            raise exc.cause from None
        table.dflash_absent = absent
        (tmp / "peer.json").write_text(table.model_dump_json(indent=2))
        (tmp / "peer.md").write_text(markdown(table))
        return {PEER_KEY: table.model_dump()}

    upstream = {} if dflash is None else {TRAIN_DFLASH.name: dflash}
    init_ray()
    vllm = vllm_where({"CPU": PEER_CPUS}, 1, "the peer table").python
    return StageCall(peer_stage(), cfg.to_dict(), out_dir, upstream, build,
                     extra={"source": source_identity(cfg), "peer": settings.model_dump(),
                            "vllm": vllm})


def _paths(text: str) -> tuple[str, ...]:
    """`--paths fast,eager` as a tuple; an unknown path is an argparse error naming the choices."""
    paths = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in paths if p not in get_args(PeerPath)]
    if unknown or not paths:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give one or more of {', '.join(get_args(PeerPath))}, comma-separated")
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.peer", description=__doc__.split("\n\n")[0])
    add_config_args(parser)
    spec = peer_stage()
    add_stage_args(parser, spec)
    for name, field in PeerSettings.model_fields.items():
        flag = f"--{name.replace('_', '-')}"
        if field.annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default,
                                help=f"{field.description} (default: {field.default})")
        elif field.annotation is ShapeDtype:
            parser.add_argument(flag, choices=get_args(ShapeDtype), default=field.default,
                                help=f"{field.description} (default: {field.default})")
        elif name == "paths":
            parser.add_argument(flag, type=_paths, default=field.default, metavar="PATH[,PATH]",
                                help=f"{field.description} (default: {','.join(field.default)})")
        else:
            parser.add_argument(flag, type=int, default=field.default,
                                help=f"{field.description} (default: {field.default})")
    parser.add_argument("--artifacts", type=Path, default=None, metavar="ROOT",
                        help="the main job's output root, whose trained DFlash head runs in both "
                             "engines (default: <paths.out_dir>/<preset>; without one, no DFlash pair)")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    settings = PeerSettings(**{k: getattr(args, k) for k in PeerSettings.model_fields})
    out = stage_out(args, cfg, spec)
    log_dir = out.parent / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    root = args.artifacts or output_root(cfg)
    run_stage_job(spec, out, lambda: peer_call(cfg, settings, out, root), args.force, args.verbose,
                  errors=(VllmError,))
    print((out / "peer.md").read_text())
    print(f"wrote {out / 'peer.json'}, {out / 'peer.md'} and {out / 'manifest.json'}")


if __name__ == "__main__":
    main()
