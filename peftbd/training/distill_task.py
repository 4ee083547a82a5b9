"""The interface of a distillation task (`DistillTask`: what trains, its loss, its eval, its
export) and what the tasks (`tasks.py`, `head_task.py`) share.

The training job (`jobs/train_common.py`) and its schedule (`schedule.py`) are the same for every
task; a task decides which module DeepSpeed trains, the train loss of a batch, the eval sums and
metrics, and what is exported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from peftbd.config import OptimConfig
from peftbd.models.peft_bd import count_parameters
from peftbd.training.deepspeed_config import BatchPlan
from peftbd.training.examples import SequenceBatch
from peftbd.training.memory import StepMemory

EVAL_EPOCH = -1
"""The noise epoch of evaluation: the same eval noise at every eval of every run."""


class DistillTask(Protocol):
    """What the training job needs from a task (see module doc)."""

    optim: OptimConfig
    export_subdir: str
    block_size: int | None  # the block its rows are counted in (the manifest's data counts)

    def build(self, device: torch.device) -> nn.Module:
        """The module DeepSpeed trains (only its trainable parameters train); its `config` is the
        model config the job hands `step_memory` (the verifier's, for a module beside it)."""

    def train_loss(self, module: nn.Module, batch: SequenceBatch, epoch: int) -> torch.Tensor: ...

    def eval_sums(self, module: nn.Module, batch: SequenceBatch) -> dict[str, torch.Tensor]: ...

    def eval_metrics(self, sums: dict[str, torch.Tensor]) -> dict[str, float | list[float] | None]: ...

    def parameter_counts(self, module: nn.Module) -> tuple[int, int]: ...

    def export(self, module: nn.Module, out_dir: Path) -> Path: ...

    def step_memory(self, model_config: Any, trainable: int, total: int, plan: BatchPlan,
                    dtype: str) -> StepMemory:
        """The estimated peak of one training step (`peftbd.training.memory`)."""


def parameter_summary(trainable: int, total: int) -> dict[str, float | int]:
    """Trainable and total parameters and the trainable share in percent."""
    return {"trainable": trainable, "total": total,
            "trainable_percent": round(100.0 * trainable / total, 4)}


def head_parameter_counts(head: nn.Module, verifier: nn.Module) -> tuple[int, int]:
    """(trainable, total) of the verifier enhanced with a head (FastMTP's, the block-diffusion
    head): the head's own weights train; the total adds the verifier's (the head shares its
    embeddings and LM head)."""
    trainable, head_total = count_parameters(head)
    return trainable, head_total + count_parameters(verifier)[1]


def ratio(num: torch.Tensor, den: torch.Tensor) -> float:
    return float(num) / max(float(den), 1e-12)
