"""The tiny world shipped with the package: a finished world stage output (corpus, tokenizer,
trained verifier, manifest) built by the recipe in `peftbd.tiny_world.build`, so that a new
machine copies it in under a second instead of training the verifier for ~6 minutes.

The world stage uses it only when its recorded fingerprint equals the one the current settings
and code give (`tiny_world.shipped: true`, the default); any other world is built from the
recipe. After changing the recipe's code or the tiny preset's `tiny_world` section, rebuild it
with `python -m peftbd.tiny_world.refresh` (`tests/peftbd/tiny_world/test_shipped.py` fails,
naming that command, while it is stale).
"""

from __future__ import annotations

import json
import shutil
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
