"""Distil the block-diffusion head (DFlash-style: its own decoder layers on the verifier's
features, one forward per block) with Ray Train.

    python -m jobs.train_head --data outputs/tiny/continuations --out outputs/tiny/bd_head
    ray job submit --working-dir . -- python -m jobs.train_head --preset qwen3-0.6b \\
        --data /shared/peftbd/continuations --out /shared/peftbd/train_head

Writes `bd_head/` (`BDHead.from_pretrained(dir, verifier)` loads it) and `manifest.json`.
"""

from __future__ import annotations

from pathlib import Path

from jobs.train_common import main, run_train
from peftbd.config import Config
from peftbd.methods.bd_head import METHOD


def run_train_head(cfg: Config, data_dir: str | Path, out_dir: str | Path, resume: bool = True) -> Path:
    """Train the block-diffusion head on the artifact in `data_dir`; Ray must be initialised (or
    is started locally). Returns `out_dir`."""
    return run_train(METHOD.recipe, cfg, data_dir, out_dir, resume=resume)


if __name__ == "__main__":
    main(METHOD.recipe)
