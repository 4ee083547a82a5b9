"""The tiny world shipped with the package: a finished world stage output (corpus, tokenizer,
trained verifier, manifest) built by the recipe in `peftbd.tiny_world.build`, so that a new
machine copies it in under a second instead of training the verifier for ~4 minutes.

The world stage uses it only when its recorded fingerprint equals the one the current settings
and code give (`tiny_world.shipped: true`, the default); any other world is built from the
recipe. After changing the recipe's code or the tiny preset's `tiny_world` section, refresh it:

    python -m peftbd.tiny_world.shipped          # rebuilds it from the recipe, ~4 min on 2 cores

(`tests/peftbd/tiny_world/test_shipped.py` fails, naming this command, while it is stale.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).resolve().parent / "shipped_world"
"""The shipped world's directory (package data)."""
MANIFEST = "manifest.json"
RUN_STAGE_KEYS = ("stage", "contract", "config", "versions", "wall_seconds", "peak_rss_mib",
                  "peak_gpu_mib")
"""Manifest keys `peftbd.stage.run_stage` writes itself: not part of what a build returns."""


def shipped_fingerprint() -> str | None:
    """The world stage fingerprint the shipped world was built for (None: none shipped)."""
    path = SHIPPED / MANIFEST
    if not path.is_file():
        return None
    return json.loads(path.read_text())["contract"]["fingerprint"]


def copy_shipped(fingerprint: str, dest: Path) -> dict[str, Any] | None:
    """Copy the shipped world into `dest` if it was built for `fingerprint`; return its build's
    manifest sections (with `origin: shipped`), or None when it was built for other inputs."""
    if shipped_fingerprint() != fingerprint:
        return None
    shutil.copytree(SHIPPED, dest, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(MANIFEST, "__pycache__", "*.lock"))
    recorded = json.loads((SHIPPED / MANIFEST).read_text())
    return {**{k: v for k, v in recorded.items() if k not in RUN_STAGE_KEYS}, "origin": "shipped"}


def refresh(dest: Path = SHIPPED) -> dict[str, Any]:
    """Rebuild the tiny preset's world from the recipe and write it to `dest` (the package's
    shipped world by default); returns its manifest."""
    from peftbd.config import load_config
    from peftbd.tiny_world.build import world_call

    tw = dataclasses.replace(load_config("tiny").tiny_world, shipped=False)
    with tempfile.TemporaryDirectory() as scratch:
        # built in a scratch dir of its own: never in the cache (env PEFTBD_CACHE included),
        # where a world of the same fingerprint may be in use
        call = dataclasses.replace(world_call(tw, scratch), out=Path(scratch) / "world")
        call.run(force=True)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(call.out, dest, ignore=shutil.ignore_patterns("*.lock", ".partial*"))
    return json.loads((dest / MANIFEST).read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m peftbd.tiny_world.shipped",
        description="Rebuild the tiny world shipped with the package from its recipe (the tiny "
        "preset's tiny_world section and the code of peftbd.tiny_world): ~4 min on 2 cores. Run "
        "it after changing either; tests/peftbd/tiny_world/test_shipped.py says when it is stale.")
    parser.add_argument("--out", type=Path, default=SHIPPED,
                        help=f"where to write it (default: the package's {SHIPPED.name}/)")
    args = parser.parse_args(argv)
    manifest = refresh(args.out)
    print(f"shipped world rebuilt into {args.out}: fingerprint {manifest['contract']['fingerprint']}, "
          f"held-out loss {manifest['heldout_loss_nats']:.3f} nats, "
          f"built in {manifest['build_seconds']:.0f}s")


if __name__ == "__main__":
    main()
