"""Distil the FastMTP head (3 recursive steps, weights [0.51, 0.31, 0.18]) with Ray Train.

    python -m jobs.train_mtp --data outputs/tiny/continuations --out outputs/tiny/mtp_head
    ray job submit --working-dir . -- python -m jobs.train_mtp --preset qwen3-0.6b \\
        --data /shared/peftbd/continuations --out /shared/peftbd/train_mtp

Writes `mtp_head/` (`MTPHead.from_pretrained(dir, verifier)` loads it) and `manifest.json`.
"""

from __future__ import annotations

from pathlib import Path

from jobs.train_common import main, run_train
from peftbd.config import Config
from peftbd.methods.fastmtp import METHOD


def run_train_mtp(cfg: Config, data_dir: str | Path, out_dir: str | Path, resume: bool = True) -> Path:
    """Train the FastMTP head on the artifact in `data_dir`; Ray must be initialised (or is
    started locally). Returns `out_dir`."""
    return run_train(METHOD.recipe, cfg, data_dir, out_dir, resume=resume)


if __name__ == "__main__":
    main(METHOD.recipe)
