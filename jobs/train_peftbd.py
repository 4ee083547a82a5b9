"""Distil the PEFT-BD drafter (LoRA + mask-token row, block-diffusion objective) with Ray Train.

    python -m jobs.train_peftbd --data outputs/tiny/continuations --out outputs/tiny/peftbd_adapter
    ray job submit --working-dir . -- python -m jobs.train_peftbd --preset qwen3-0.6b \\
        --data /shared/peftbd/continuations --out /shared/peftbd/train_peftbd

Writes `adapter/` (`PeftModel.from_pretrained` loads it; the trained mask-token row is inside it,
peft's `trainable_token_indices`) and `manifest.json`.
"""

from __future__ import annotations

from pathlib import Path

from jobs.train_common import main, run_train
from peftbd.config import Config
from peftbd.methods.peft_bd import METHOD


def run_train_peftbd(cfg: Config, data_dir: str | Path, out_dir: str | Path, resume: bool = True) -> Path:
    """Train the PEFT-BD adapter on the artifact in `data_dir`; Ray must be initialised (or is
    started locally). Returns `out_dir`."""
    return run_train(METHOD.recipe, cfg, data_dir, out_dir, resume=resume)


if __name__ == "__main__":
    main(METHOD.recipe)
