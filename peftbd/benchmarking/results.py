"""Assemble results.json (schema: `peftbd.benchmarking.schema`) and the stage's memory stats from
the timing workers' shards."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from peftbd.benchmarking.aggregate import add_oracles, arm_entries, decodes_of
from peftbd.benchmarking.arms import arm_specs
from peftbd.benchmarking.concurrency import concurrency_rows
from peftbd.benchmarking.prompts import PromptSet
from peftbd.benchmarking.runner import ShardResult
from peftbd.benchmarking.sampled import sampled_prompts, sampling_block
from peftbd.benchmarking.references import ReferenceCheck
from peftbd.benchmarking.schema import (
    DrafterInfo,
    MeasuredOn,
    PromptsInfo,
    Reference,
    Results,
    Timing,
)
from peftbd.config import Config
from peftbd.manifest import WorkerPeaks


def build_results(cfg: Config, prompt_set: PromptSet, shards: Sequence[ShardResult], repeats: int,
                  drafters: dict[str, DrafterInfo], how: str) -> Results:
    """results.json from the workers' measurements; `drafters` describes the drafter artifacts,
    `how` the timing placement."""
    d, first, specs = cfg.decoding, shards[0], arm_specs(cfg)
    rows = concurrency_rows([run for s in shards for run in s.batch_runs], [s.id for s in specs],
                            d.batch_sizes)
    sampled = {p.id for p in sampled_prompts(cfg, prompt_set.prompts)}
    arms = arm_entries(specs, shards, {p.id: p.category for p in prompt_set.prompts})
    add_oracles(arms)
    return Results(
        preset=cfg.preset,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        measured_on=MeasuredOn(model=cfg.model.name_or_path, engine=first.engine,
                               hardware=first.hardware, device=first.device, dtype=first.dtype,
                               floor=first.floor),
        prompts=PromptsInfo(source=prompt_set.source, path=prompt_set.path,
                            count=len(prompt_set.prompts), max_new_tokens=d.max_new_tokens,
                            categories=prompt_set.categories(), dropped=prompt_set.dropped),
        timing=Timing(
            workers=len(shards), torch_threads=d.torch_threads, repeats=repeats,
            worker_num_cpus=d.worker_num_cpus, worker_num_gpus=d.worker_num_gpus,
            batch_sizes=list(d.batch_sizes), sweep_repeats=min(d.sweep_repeats, repeats),
            sweep_variants=d.sweep_variants, how=how,
            per_worker_hardware=[s.hardware for s in shards],
            per_worker_peak_rss_mib=[s.peak_rss_mib for s in shards]),
        drafters=drafters,
        arms=arms,
        concurrency=rows,
        sampling=sampling_block(specs, d.temperatures, d.sampling_seed, len(sampled),
                                {s.id: decodes_of(shards, s.id, sampled) for s in specs},
                                [p for shard in shards for p in shard.sampled]),
        config=cfg.to_dict(),
        references=reference_rows(shards[0].references),  # the first shard checks them
    )


def reference_rows(checks: Sequence[ReferenceCheck]) -> list[Reference]:
    """The reference checks as results.json rows, in the engines' order."""
    return [Reference(engine=c.engine, checked=c.checked, identical=c.identical,
                      mismatches=list(c.mismatches), absent=c.absent, version=c.version)
            for c in checks]


def stage_stats(driver: dict[str, Any], shards: Sequence[ShardResult]) -> dict[str, Any]:
    """The driver's `StageTimer.stats()` with peak memory taken as the max over the driver and the
    timing workers (where the models live); the driver's own peak RSS is kept beside it, and the
    workers' peaks and dtype are the `workers` section (as every stage with workers has)."""
    gpu = [s.peak_gpu_mib for s in shards if s.peak_gpu_mib is not None]
    workers = WorkerPeaks.combine([WorkerPeaks(1, s.peak_rss_mib, s.peak_gpu_mib, s.dtype or None)
                                   for s in shards])
    return {**driver,
            "peak_rss_mib": max([driver["peak_rss_mib"], *(s.peak_rss_mib for s in shards)]),
            "peak_gpu_mib": max(gpu) if gpu else driver["peak_gpu_mib"],
            "driver_peak_rss_mib": driver["peak_rss_mib"], "workers": workers.to_dict()}
