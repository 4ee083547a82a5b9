"""The peer table: our engine beside vLLM in one run, `python -m jobs.peer` (vLLM from
`bash scripts/install.sh --with-vllm`; no Ray). What it measures: `peftbd.benchmarking.peer`.
Writes `<out>/peer.json`, `peer.md` and `manifest.json` (default `outputs/<preset>/peer`, where the
benchmark's report finds it)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from peftbd.analysis.peer import PEER_KEY, markdown
from peftbd.benchmarking.peer import PeerSettings, run
from peftbd.cli import add_config_args, add_stage_args, config_from_args, run_stage_job, stage_out
from peftbd.config import Config
from peftbd.data.sources import source_identity
from peftbd.layout import peer_stage
from peftbd.peers.vllm_client import VllmError
from peftbd.peers.vllm_env import vllm_python
from peftbd.stage import StageCall, StageInputs


def peer_call(cfg: Config, settings: PeerSettings, out_dir: Path) -> StageCall:
    """The peer run as a stage (`peftbd.layout.peer_stage`) writing `out_dir`."""
    def build(tmp: Path, _inputs: StageInputs) -> dict[str, Any]:
        table = run(cfg, settings, out_dir.parent / "logs")
        (tmp / "peer.json").write_text(table.model_dump_json(indent=2))
        (tmp / "peer.md").write_text(markdown(table))
        return {PEER_KEY: table.model_dump()}

    return StageCall(peer_stage(), cfg.to_dict(), out_dir, {}, build,
                     extra={"source": source_identity(cfg), "peer": settings.model_dump(),
                            "vllm": str(vllm_python())})


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
        else:
            parser.add_argument(flag, type=int, default=field.default,
                                help=f"{field.description} (default: {field.default})")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    settings = PeerSettings(**{k: getattr(args, k) for k in PeerSettings.model_fields})
    out = stage_out(args, cfg, spec)
    log_dir = out.parent / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    run_stage_job(spec, out, lambda: peer_call(cfg, settings, out), args.force, args.verbose, errors=(VllmError,))
    print((out / "peer.md").read_text())
    print(f"wrote {out / 'peer.json'}, {out / 'peer.md'} and {out / 'manifest.json'}")


if __name__ == "__main__":
    main()
