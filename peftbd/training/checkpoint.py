"""Training checkpoints (DeepSpeed engine state + the step) and the exported artifact inside them.

A checkpoint directory holds DeepSpeed's files under the tag `ds` (trainable weights, optimizer,
LR scheduler; every frozen tensor is excluded), `client_state` with the step, the run's
fingerprint, the tokens trained on and the learning curve so far, and, in the final checkpoint,
`export/` with the artifact the job publishes.

Frozen tensors: DeepSpeed's `exclude_frozen_parameters` drops the state-dict entries that
`named_parameters()` lists, which names a shared tensor once. A tied embedding under peft's
token adapter is in the state dict twice (`...embed_tokens.token_adapter.base_layer.weight` and
`...lm_head.token_adapter.base_layer.weight`), so the head's copy of the frozen table stayed in
every PEFT-BD checkpoint (622 MB of 663 MB at Qwen3-0.6B). `save_checkpoint` therefore drops
every state-dict name of a frozen parameter, shared names included, while DeepSpeed saves.
A run lives at `<storage_path>/<name>` (Ray Train's layout), local or on cloud storage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs
from torch import nn

from peftbd.errors import UserError
from peftbd.training.learning_curve import CurvePoint

TAG = "ds"
EXPORT_DIR = "export"


@dataclass(frozen=True)
class TrainState:
    """Where training stands: optimizer steps done, the sequence tokens trained on so far (summed
    over the workers) and the learning curve's points so far (`peftbd.training.learning_curve`),
    so a resumed run keeps its curve."""

    step: int = 0
    train_tokens: int = 0
    curve: tuple[CurvePoint, ...] = ()


def frozen_names(module: nn.Module) -> set[str]:
    """Every state-dict name of a frozen parameter, each name of a shared tensor included."""
    return {n for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}


@contextlib.contextmanager
def without_frozen(module: nn.Module) -> Iterator[None]:
    """Within the block, `module.state_dict()` leaves out every frozen parameter (see module doc)."""
    frozen = frozen_names(module)

    def drop(_module: nn.Module, state: dict[str, Any], prefix: str, _meta: Any) -> None:
        for name in frozen:
            state.pop(prefix + name, None)

    handle = module.register_state_dict_post_hook(drop)
    try:
        yield
    finally:
        handle.remove()


def save_checkpoint(engine: Any, ckpt_dir: str | Path, state: TrainState, fingerprint: str) -> None:
    """Every rank calls this (DeepSpeed writes each rank's optimizer partition); only what trains
    is saved (`without_frozen`)."""
    with without_frozen(engine.module):
        engine.save_checkpoint(
            str(ckpt_dir), tag=TAG,
            client_state={"step": state.step, "fingerprint": fingerprint,
                          "train_tokens": state.train_tokens,
                          "learning_curve": [p.to_dict() for p in state.curve]},
            exclude_frozen_parameters=True,
        )


class CheckpointMismatch(UserError, ValueError):
    """A checkpoint that cannot belong to this run (other inputs, other shapes): retrying cannot
    help; the message says how to start over."""


def load_checkpoint(engine: Any, ckpt_dir: str | Path, fingerprint: str) -> TrainState:
    """Restore the engine from `ckpt_dir`; fails with `CheckpointMismatch` if the checkpoint
    belongs to another run or its tensors have other shapes."""
    try:
        _, client = engine.load_checkpoint(str(ckpt_dir), tag=TAG, load_module_strict=False)
    except RuntimeError as exc:
        if "size mismatch" not in str(exc):
            raise
        raise CheckpointMismatch(
            f"the checkpoint in {ckpt_dir} holds tensors of other shapes than this run's model "
            f"({str(exc).splitlines()[-1].strip()[:200]}); rerun with --no-resume to start over, "
            "or use another --out"
        ) from exc
    if client is None:
        raise FileNotFoundError(f"{ckpt_dir} holds no DeepSpeed checkpoint tagged {TAG!r}")
    if client.get("fingerprint") != fingerprint:
        raise CheckpointMismatch(
            f"the checkpoint in {ckpt_dir} was written by a run with another config or artifact "
            f"(fingerprint {client.get('fingerprint')} != {fingerprint}); rerun with --no-resume "
            "to start over, or use another --out (the run name)"
        )
    return TrainState(step=int(client["step"]), train_tokens=int(client.get("train_tokens", 0)),
                      curve=tuple(CurvePoint.from_dict(p) for p in client.get("learning_curve", ())))


def run_location(storage_path: str, out_dir: Path, fingerprint: str) -> tuple[str, str]:
    """(storage_path, run name) of the training run that writes `out_dir` for the stage inputs
    `fingerprint`: the name is `<out dir name>-<fingerprint>`, so changed inputs start a new run
    instead of resuming an incompatible one; the storage is `storage_path`
    (`training.storage_path`) or, when empty, a `ray_train/` dir beside `out_dir`."""
    storage = storage_path or str(Path(out_dir).resolve().parent / "ray_train")
    if "://" not in storage:
        storage = str(Path(storage).expanduser().resolve())  # Ray Train wants an absolute path
    return storage, f"{Path(out_dir).name}-{fingerprint}"


def delete_run(storage: str, name: str) -> None:
    """Remove a run's checkpoints and state (local or cloud storage) so it starts over."""
    fs, root = pyarrow.fs.FileSystem.from_uri(storage)
    path = f"{root.rstrip('/')}/{name}"
    if fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound:
        fs.delete_dir(path)
