"""Evaluation on the val split, summed over batches and (when distributed) over workers."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from peftbd.training.distill_task import DistillTask
from peftbd.training.examples import SequenceBatch


def rank_rows(batch: dict, rank: int, world_size: int) -> dict:
    """The rows `rank`, `rank + world_size`, ... of a columnar batch (every worker reads the whole
    val set; each evaluates its own rows, so the result does not depend on the worker count)."""
    return {k: v[rank::world_size] for k, v in batch.items()}


@torch.no_grad()
def evaluate(task: DistillTask, module: nn.Module, batches: Iterable[SequenceBatch]) -> dict:
    """`task.eval_metrics` of the eval sums over `batches`, all-reduced across the process group
    (`sum_over_workers`: sums only; the accepted prefix's interval comes from summed per-row
    moments, `peftbd.training.rounds.round_sums`).

    Every rank must evaluate at least one batch (the job checks the val split is large enough).
    """
    was_training = module.training
    module.eval()
    totals: dict[str, torch.Tensor] = {}
    for batch in batches:
        for key, value in task.eval_sums(module, batch).items():
            value = value.detach().double().cpu()
            totals[key] = totals[key] + value if key in totals else value
    module.train(was_training)
    if not totals:
        raise ValueError("evaluate() got no val batch on this worker; the val split needs at "
                         "least training.num_workers rows")
    return task.eval_metrics(sum_over_workers(totals, next(module.parameters()).device))


def sum_over_workers(totals: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """`totals` summed over the process group's ranks (one all-reduce of all of them, on `device`:
    NCCL reduces only device tensors), on the CPU; `totals` itself without a process group. Every
    rank must call it with the same keys and shapes."""
    if not (dist.is_available() and dist.is_initialized()):
        return totals
    keys = sorted(totals)
    flat = torch.cat([totals[k].reshape(-1) for k in keys]).to(device)
    dist.all_reduce(flat)
    flat = flat.cpu()
    out, offset = {}, 0
    for k in keys:
        n = totals[k].numel()
        out[k] = flat[offset : offset + n].reshape(totals[k].shape)
        offset += n
    return out
