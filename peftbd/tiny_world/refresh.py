"""Rebuild the tiny world shipped with the package (`peftbd.tiny_world.shipped`) from its recipe:

    python -m peftbd.tiny_world.refresh          # ~6 min on 2 cores

Run it after changing the recipe's code or the tiny preset's `tiny_world` section
(`tests/peftbd/tiny_world/test_shipped.py` fails, naming this command, while it is stale).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from peftbd.config import load_config
from peftbd.tiny_world.build import world_call
from peftbd.tiny_world.shipped import MANIFEST, SHIPPED


def refresh(dest: Path = SHIPPED) -> dict[str, Any]:
    """Rebuild the tiny preset's world from the recipe and write it to `dest` (the package's
    shipped world by default); returns its manifest."""
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
        prog="python -m peftbd.tiny_world.refresh",
        description="Rebuild the tiny world shipped with the package from its recipe (the tiny "
        "preset's tiny_world section and the code of peftbd.tiny_world): ~6 min on 2 cores. Run "
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
