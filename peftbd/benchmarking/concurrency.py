"""The concurrency sweep: every arm decodes the same prompts with continuous batching at each
`decoding.batch_sizes` entry B (at most B requests at once: `SpeculativeDecoder.decode_many`).

Every batch size is timed the same way: the wall clock (`Clock`, CUDA-synced) around one pass
over all of a worker's prompts, and aggregate tok/s = generated tokens / that wall time. A row's
own `decode_s` would be a latency (a batched round's time counts, whole, in every row it served),
never a share of the throughput. Batch 1 is the benchmark's batch-1 pass itself (its prompts
decoded one after another, the same code path as `decode_many` at batch 1), timed whole, so it
is not run twice. Exact = every output equals greedy AR's batch-1 output for that prompt.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from peftbd.benchmarking.schema import ConcurrencyRow
from peftbd.decoding import DecodeResult

WARMUP_TOKENS = 8
"""New tokens of the untimed warm-up decode at each batch size (its batch shapes; at batch 1 a
whole decode with the compiled fast path, whose graphs compile per width)."""


@dataclass(frozen=True)
class BatchRun:
    """One worker's timed pass of one arm over its prompts at one batch size and repeat: wall
    seconds, generated tokens, rounds and tokens emitted by them (summed over rows), and how
    many of its `prompts` decoded exactly AR's batch-1 output."""

    arm: str
    batch_size: int
    repeat: int
    wall_s: float
    new_tokens: int
    rounds: int
    emitted: int
    exact: int
    prompts: int


def batch_run(arm: str, batch_size: int, repeat: int, wall_s: float,
              decoded: Sequence[DecodeResult], reference: Sequence[Sequence[int]]) -> BatchRun:
    """The `BatchRun` of a pass whose `decoded[i]` is prompt i; `reference[i]`: AR's batch-1
    output for it."""
    if len(decoded) != len(reference):
        raise ValueError(f"{len(decoded)} decodes for {len(reference)} reference outputs")
    return BatchRun(
        arm=arm, batch_size=batch_size, repeat=repeat, wall_s=wall_s,
        new_tokens=sum(len(d.tokens) for d in decoded),
        rounds=sum(len(d.rounds) for d in decoded),
        emitted=sum(r.emitted for d in decoded for r in d.rounds),
        exact=sum(list(d.tokens) == list(ref) for d, ref in zip(decoded, reference)),
        prompts=len(decoded),
    )


def concurrency_rows(runs: Sequence[BatchRun], arms: Sequence[str],
                     batch_sizes: Sequence[int]) -> list[ConcurrencyRow]:
    """One row per arm (in `arms` order) and batch size (in `batch_sizes` order) that has runs
    (every arm at batch 1; at B > 1 the arms the sweep covers: `runner.swept`) from every
    worker's runs: per repeat, tokens and wall seconds summed over the workers (so, as the
    batch-1 numbers, it does not depend on the worker count); tok/s is the median over repeats,
    speedup the arm's over AR's at that batch size."""
    rows = []
    for arm in arms:
        for b in batch_sizes:
            mine = [r for r in runs if r.arm == arm and r.batch_size == b]
            if not mine and b == 1:
                raise ValueError(f"no timed run of arm {arm!r} at batch size 1")
            if not mine:
                continue
            repeats = sorted({r.repeat for r in mine})
            tokens = [sum(r.new_tokens for r in mine if r.repeat == k) for k in repeats]
            walls = [sum(r.wall_s for r in mine if r.repeat == k) for k in repeats]
            rounds = sum(r.rounds for r in mine)
            rows.append(ConcurrencyRow(
                arm=arm, batch_size=b,
                tokens_per_s=statistics.median(n / w for n, w in zip(tokens, walls)),
                mean_accepted=sum(r.emitted for r in mine) / rounds if rounds else None,
                exact=all(r.exact == r.prompts for r in mine), speedup_vs_ar=None,
                wall_s=statistics.median(walls)))
    ar = {r.batch_size: r.tokens_per_s for r in rows if r.arm == "ar"}
    return [dataclasses.replace(r, speedup_vs_ar=r.tokens_per_s / ar[r.batch_size])
            if ar.get(r.batch_size) else r for r in rows]
