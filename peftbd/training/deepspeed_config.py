"""The DeepSpeed config of a training job: `ds_zero.json` (kept in the repo) filled from the config.

The template fixes what never varies (AdamW via `torch_adam`, so nothing is JIT-compiled, gradient
clipping, no per-step prints); this module fills batch sizes, the ZeRO stage, precision, the
learning rate and DeepSpeed's own warmup + cosine/constant scheduler from `cfg.training` and the
job's `OptimConfig`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, get_args

from peftbd.config import ConfigError, OptimConfig, TrainingConfig, cache_root
from peftbd.config_sections import Precision, Scheduler, ZeroStage

TEMPLATE = "ds_zero.json"


@dataclass(frozen=True)
class BatchPlan:
    """How a global batch of sequences splits into workers, micro-batches and accumulation."""

    global_batch: int
    micro_batch: int
    accumulation: int
    world_size: int

    def steps_per_epoch(self, rows: int) -> int:
        """Optimizer steps per pass over `rows` split equally over the workers (the remainder of
        the split and of each worker's share is dropped); fails when not even one step fits."""
        steps = rows // self.world_size // self.micro_batch // self.accumulation
        if steps == 0:
            raise ConfigError(
                f"the train split has {rows} usable rows, fewer than one global batch "
                f"(optim.global_batch_size={self.global_batch}); lower the batch size or "
                "regenerate with a larger data.train_size"
            )
        return steps


def batch_plan(training: TrainingConfig, optim: OptimConfig, world_size: int) -> BatchPlan:
    """Split `optim.global_batch_size` over `world_size` workers and `training.micro_batch_size`."""
    per_worker, rest = divmod(optim.global_batch_size, world_size)
    if rest or per_worker == 0:
        raise ConfigError(
            f"optim.global_batch_size={optim.global_batch_size} is not a positive multiple of "
            f"training.num_workers={world_size}; set it to a multiple (e.g. {world_size * 8})"
        )
    micro = training.micro_batch_size or per_worker
    accumulation, rest = divmod(per_worker, micro)
    if rest or accumulation == 0:
        raise ConfigError(
            f"training.micro_batch_size={micro} does not divide the per-worker batch {per_worker} "
            f"(optim.global_batch_size / training.num_workers); use a divisor of {per_worker}"
        )
    return BatchPlan(optim.global_batch_size, micro, accumulation, world_size)


def _check_choice(key: str, value: object, choices: object) -> None:
    """Configs built in code skip `load_config`'s checks; fail here rather than in DeepSpeed."""
    allowed = get_args(choices)
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(map(str, allowed))}")


PRECISION_DTYPES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16"}
"""`training.precision` -> the torch dtype name training runs in (module and verifier alike)."""


def training_dtype(training: TrainingConfig) -> str:
    """The dtype `training.precision` trains in, on every device: DeepSpeed's bf16 (ZeRO
    included) runs on CPU too, so a CPU run trains in what the config says."""
    _check_choice("training.precision", training.precision, Precision)
    return PRECISION_DTYPES[training.precision]


def deepspeed_config(training: TrainingConfig, optim: OptimConfig, world_size: int) -> dict[str, Any]:
    """The `deepspeed.initialize(config=...)` dict for one job."""
    _check_choice("training.zero_stage", training.zero_stage, ZeroStage)
    _check_choice("optim.scheduler", optim.scheduler, Scheduler)
    plan = batch_plan(training, optim, world_size)
    ds = json.loads(resources.files("peftbd.training").joinpath(TEMPLATE).read_text())
    ds["train_batch_size"] = plan.global_batch
    ds["train_micro_batch_size_per_gpu"] = plan.micro_batch
    ds["gradient_accumulation_steps"] = plan.accumulation
    ds["zero_optimization"]["stage"] = training.zero_stage
    ds["bf16"]["enabled"] = training_dtype(training) == "bfloat16"
    ds["optimizer"]["params"].update(lr=optim.lr, weight_decay=optim.weight_decay)
    warmup = max(1, round(optim.warmup_ratio * optim.max_steps))
    if optim.scheduler == "cosine":
        ds["scheduler"] = {"type": "WarmupCosineLR", "params": {  # max_steps 0: an untrained export
            "total_num_steps": max(1, optim.max_steps), "warmup_num_steps": warmup,
            "warmup_min_ratio": 0.0, "cos_min_ratio": 0.0, "warmup_type": "linear"}}
    else:
        ds["scheduler"] = {"type": "WarmupLR", "params": {
            "warmup_min_lr": 0.0, "warmup_max_lr": optim.lr, "warmup_num_steps": warmup,
            "warmup_type": "linear"}}
    return ds


def torch_extensions_dir(cache_dir: str) -> Path:
    """Where DeepSpeed's JIT-built ops are cached under the cache (`paths.cache_dir`); set
    `TORCH_EXTENSIONS_DIR` to it before `deepspeed.initialize` so only the first run builds. The
    CPU shm comm op (~30 s to build) is built here only where the DeepSpeed install did not
    pre-build it (`scripts/install.sh` does, on a machine without an NVIDIA GPU)."""
    return cache_root(cache_dir) / "torch_extensions"
