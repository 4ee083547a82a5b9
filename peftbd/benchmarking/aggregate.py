"""From the workers' raw decodes to the per-arm entries of results.json (schema: `schema.py`).

Run-level metrics come from the engine's `summarize` (its definitions: accepted tokens per round
include the bonus token, as the paper counts them); this module only groups decodes by arm, repeat
and category and takes mean ± std over the repeated runs, and the intervals over the prompts
(`noise`) of the batch-1 throughput and of the tokens per round, per arm and per category, and
of each arm's tokens per round with its categories weighted equally (`Arm.mix_accepted`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from peftbd.benchmarking.arms import ArmSpec
from peftbd.benchmarking.noise import (
    acceptance_interval,
    acceptance_mix,
    speedup_interval,
    throughput_interval,
)
from peftbd.benchmarking.replay import ReplaySums
from peftbd.benchmarking.runner import Compiles, RoundFloor, ShardResult
from peftbd.benchmarking.schema import (
    ORACLE_TARGETS,
    Arm,
    Audit,
    Calls,
    CategoryStats,
    Forward,
    Oracle,
    OverFloor,
    PerPosition,
    Repeat,
    Round,
    Speedup,
    Stat,
    Throughput,
    stat,
)
from peftbd.cost_model import draft_cost_oracle
from peftbd.decoding import DecodeResult, audit_summary, summarize
from peftbd.decoding.audit import Mismatch
from peftbd.decoding.graph_audit import CudaGraphUse
from peftbd.methods.arm import AR


def merge_runs(shards: Sequence[ShardResult], arm_id: str) -> list[list[DecodeResult]]:
    """`runs[repeat]`: the arm's decodes of every prompt (shards concatenated in order)."""
    repeats = len(shards[0].results[arm_id])
    return [[res for shard in shards for res in shard.results[arm_id][r]] for r in range(repeats)]


def decodes_of(shards: Sequence[ShardResult], arm_id: str,
               prompt_ids: set[str]) -> list[DecodeResult]:
    """The arm's batch-1 decodes (every repeat) of the prompts in `prompt_ids`."""
    return [res for shard in shards for run in shard.results[arm_id]
            for pid, res in zip(shard.prompt_ids, run) if pid in prompt_ids]


@dataclass(frozen=True)
class _RepeatStats:
    summaries: list[dict[str, Any]]  # the engine's `summarize` of each repeated run
    tokens_per_s: Stat
    mean_accepted: Stat


def _repeat_stats(runs: Sequence[Sequence[DecodeResult]]) -> _RepeatStats:
    summaries = [summarize(run) for run in runs]
    return _RepeatStats(summaries, stat([m["tokens_per_s"] for m in summaries]),
                        stat([m["mean_accepted"] for m in summaries]))


def _forward(overall: dict[str, Any], repeats: int) -> Forward:
    """Draft and verify calls per run (all prompts once) and mean latency over every run."""
    calls = {}
    for mode in ("draft", "verify"):
        f = overall["forward"].get(mode)
        calls[mode] = Calls(calls=round(f["calls"] / repeats), mean_ms=f["mean_ms"]) if f else \
            Calls(calls=0, mean_ms=None)
    return Forward(**calls)


def category_entry(runs: Sequence[Sequence[DecodeResult]], speculative: bool) -> CategoryStats:
    """One arm on one category's prompts (`runs[repeat][prompt]`, those prompts only): tok/s and
    tokens per round over the repeats, the latter's interval over the prompts, position-1
    acceptance and rounds over every repeat (AR: no interval, no position 1)."""
    stats = _repeat_stats(runs)
    pooled = summarize([res for run in runs for res in run])
    rate = pooled["per_position"]["rate"]
    return CategoryStats(
        prompts=len(runs[0]) if runs else 0, tokens_per_s=stats.tokens_per_s,
        mean_accepted=stats.mean_accepted,
        mean_accepted_ci95=acceptance_interval(runs) if speculative else None,
        position1_acceptance=rate[0] if speculative and rate else None, rounds=pooled["rounds"])


def arm_entry(spec: ArmSpec, runs: Sequence[Sequence[DecodeResult]], categories: Sequence[str | None],
              mismatches: Sequence[Mismatch], replay: ReplaySums | None = None,
              ar_runs: Sequence[Sequence[DecodeResult]] | None = None,
              floor: RoundFloor | None = None, paths: dict[str, str] | None = None,
              compiles: Sequence[Compiles] = ()) -> Arm:
    """The results.json entry of one arm (its oracle is filled in by `add_oracles`); `replay`:
    its rounds replayed offline on the same prompts (None: the arm has no replay); `ar_runs`:
    AR's decodes of the same prompts, for the speedup and its interval (None: no AR arm);
    `floor`: one round's floor on the device (None: not counted); `paths`: the path of each
    forward of its round (`SpeculativeDecoder.forward_paths`); `compiles`: its fast-path compiles
    on each worker."""
    stats = _repeat_stats(runs)
    overall = summarize([res for run in runs for res in run])
    speculative = spec.method != AR
    per_category = {cat: [[run[i] for i, c in enumerate(categories) if c == cat] for run in runs]
                    for cat in sorted({c for c in categories if c is not None})}
    by_category = {cat: category_entry(r, speculative) for cat, r in per_category.items()}
    mix = acceptance_mix(list(per_category.values())) if speculative else None
    rnd = overall["round"]
    return Arm(
        label=spec.label, method=spec.method, stage=spec.stage, settings=spec.settings(),
        repeats=[Repeat(**{k: m[k] for k in Repeat.model_fields}) for m in stats.summaries],
        tokens_per_s=Throughput(**stats.tokens_per_s.model_dump(), ci95=throughput_interval(runs)),
        mean_accepted=stats.mean_accepted,
        mean_accepted_ci95=acceptance_interval(runs) if speculative else None,
        mix_accepted=None if mix is None else mix[0],
        mix_accepted_ci95=None if mix is None else mix[1],
        speedup_vs_ar=None if ar_runs is None else Speedup(
            mean=stats.tokens_per_s.mean / _repeat_stats(ar_runs).tokens_per_s.mean,
            ci95=speedup_interval(runs, ar_runs)),
        mean_accepted_prefix=overall["mean_accepted_prefix"],
        token_acceptance=overall["token_acceptance"],
        block_acceptance=overall["block_acceptance"],
        replay=None if replay is None else replay.entry(),
        per_position=PerPosition(**overall["per_position"]),
        forward=_forward(overall, len(runs)),
        round=Round(**{k: rnd[k] for k in Round.model_fields}),
        audit=Audit(**audit_summary(len(categories), mismatches)) if speculative else None,
        oracle=None,
        by_category=by_category,
        floor=None if floor is None else _over_floor(floor, rnd["draft_ms"],
                                                     overall["forward"].get("verify")),
        paths=paths or {},
        compile_s=round(sum(c.seconds for c in compiles), 1),
        timed_compiles=sum(c.timed for c in compiles),
        **_cuda_graphs([c.cuda_graphs for c in compiles if c.cuda_graphs is not None]),
    )


def _cuda_graphs(uses: Sequence[CudaGraphUse]) -> dict[str, int | None]:
    """The arm's CUDA-graph replays and skips summed over the workers (None: none on CUDA)."""
    if not uses:
        return {"cuda_graph_replays": None, "cuda_graph_skips": None}
    return {"cuda_graph_replays": sum(u.replays for u in uses),
            "cuda_graph_skips": sum(u.skips for u in uses)}


def _over_floor(floor: RoundFloor, draft_ms_round: float,
                verify: dict[str, Any] | None) -> OverFloor:
    """The arm's round against its floor on the device: measured / floor ("x over floor")."""
    verify_ms = verify["mean_ms"] if verify else None
    return OverFloor(
        draft_ms_round=floor.draft_ms_round, verify_ms_forward=floor.verify_ms_forward,
        draft_x=round(draft_ms_round / floor.draft_ms_round, 2) if floor.draft_ms_round else None,
        verify_x=round(verify_ms / floor.verify_ms_forward, 2) if verify_ms else None)


def arm_entries(specs: Sequence[ArmSpec], shards: Sequence[ShardResult],
                category_of: dict[str, str | None]) -> dict[str, Arm]:
    """Every arm's entry from the workers' shards; `category_of` maps prompt id -> category."""
    categories = [category_of[i] for shard in shards for i in shard.prompt_ids]
    ar_id = next((s.id for s in specs if s.method == AR), None)
    ar = merge_runs(shards, ar_id) if ar_id else None
    return {
        s.id: arm_entry(s, merge_runs(shards, s.id), categories,
                        [m for shard in shards for m in shard.mismatches.get(s.id, [])],
                        _replay(shards, s.id), ar, shards[0].floors.get(s.id),
                        shards[0].paths.get(s.id),
                        [shard.compiles[s.id] for shard in shards if s.id in shard.compiles])
        for s in specs
    }


def _replay(shards: Sequence[ShardResult], arm_id: str) -> ReplaySums | None:
    """The arm's replay summed over the shards (None when no shard replayed it)."""
    parts = [shard.replay[arm_id] for shard in shards if arm_id in shard.replay]
    return sum(parts, ReplaySums()) if parts else None


def add_oracles(arms: dict[str, Arm]) -> None:
    """Fill each speculative arm's `oracle` with the engine's draft-cost oracle from its measured
    T0, draft share and accepted tokens per round, targeting the measured throughput of the
    ORACLE_TARGETS arms (FastMTP, AR)."""
    targets = {t: arms[t].tokens_per_s.mean for t in ORACLE_TARGETS if t in arms}
    for arm in arms.values():
        if arm.speculative:
            arm.oracle = Oracle.model_validate(draft_cost_oracle(
                arm.round.t0_s, arm.round.draft_share, arm.mean_accepted.mean, targets))
