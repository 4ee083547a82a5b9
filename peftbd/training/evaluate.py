"""Evaluation on the val split: sums over batches and (when distributed) over workers, and the
per-row values gathered in the val split's order."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from peftbd.training.distill_task import DistillTask
from peftbd.training.examples import SequenceBatch
from peftbd.training.learning_curve import ROW_VALUES

ROWS = "rows"
"""The eval-sums key of per-row values (`peftbd.training.rounds.row_values`: a (rows, k) tensor
per batch): `evaluate` gathers them instead of adding them up, and hands `eval_metrics` the
(all rows, k) tensor of every evaluated val row in the val split's order."""


def rank_rows(batch: dict, rank: int, world_size: int) -> dict:
    """The rows `rank`, `rank + world_size`, ... of a columnar batch (every worker reads the whole
    val set; each evaluates its own rows, so the result does not depend on the worker count)."""
    return {k: v[rank::world_size] for k, v in batch.items()}


@torch.no_grad()
def evaluate(task: DistillTask, module: nn.Module, batches: Iterable[SequenceBatch]) -> dict:
    """`task.eval_metrics` of the eval sums over `batches`, all-reduced across the process group
    (`sum_over_workers`), with the per-row values under `ROWS` gathered (`gather_rows`). When
    the task gives per-row values, the metrics also hold them as lists under
    `learning_curve.ROW_VALUES` (the same rows in the same order at every evaluation of a run:
    its val batches are read once).

    Every rank must evaluate at least one batch (the job checks the val split is large enough).
    """
    was_training = module.training
    module.eval()
    totals: dict[str, torch.Tensor] = {}
    rows: list[torch.Tensor] = []
    for batch in batches:
        for key, value in task.eval_sums(module, batch).items():
            value = value.detach().cpu()
            if key == ROWS:
                rows.append(value.long())
                continue
            value = value.double()
            totals[key] = totals[key] + value if key in totals else value
    module.train(was_training)
    if not totals:
        raise ValueError("evaluate() got no val batch on this worker; the val split needs at "
                         "least training.num_workers rows")
    device = next(module.parameters()).device
    sums = sum_over_workers(totals, device)
    if not rows:
        return task.eval_metrics(sums)
    sums[ROWS] = gather_rows(rows, device)
    return {**task.eval_metrics(sums), ROW_VALUES: sums[ROWS].tolist()}


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


def gather_rows(batches: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Every worker's per-row values (one (rows, k) tensor per val batch) in the val split's
    order, on the CPU: batch b of rank r holds the rows r, r + world, ... of the val split's
    batch b (`rank_rows`), so they interleave back. Without a process group: `batches`
    concatenated. Every rank must call it (with tensors of the same k)."""
    mine = torch.cat(list(batches))
    if not (dist.is_available() and dist.is_initialized()):
        return mine
    sizes = _all_gather_padded(torch.tensor([len(b) for b in batches], dtype=torch.long), device)
    shares = [list(torch.split(rows, s.tolist())) for rows, s in
              zip(_all_gather_padded(mine, device), sizes)]
    out = []
    for b in range(max(len(s) for s in shares)):
        of_batch = [s[b] for s in shares if b < len(s)]
        for j in range(max(len(rows) for rows in of_batch)):
            out += [rows[j] for rows in of_batch if j < len(rows)]
    return torch.stack(out) if out else mine[:0]


def _all_gather_padded(values: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
    """Each rank's `values` (tensors of any length along dim 0, the rest of the shape equal), in
    rank order, on the CPU: padded to the longest for the all-gather, on `device` (NCCL)."""
    n = torch.tensor([len(values)], dtype=torch.long, device=device)
    lengths = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
    dist.all_gather(lengths, n)
    longest = int(max(int(x) for x in lengths))
    padded = torch.zeros((longest, *values.shape[1:]), dtype=values.dtype, device=device)
    padded[: len(values)] = values.to(device)
    gathered = [torch.zeros_like(padded) for _ in lengths]
    dist.all_gather(gathered, padded)
    return [g[: int(x)].cpu() for g, x in zip(gathered, lengths)]
