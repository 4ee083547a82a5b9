"""The benchmark's `results.json`: its documented shape and small accessors.

```
{
  "schema": "peftbd-benchmark/3",
  "preset": "tiny",
  "created": "2025-01-01T00:00:00+00:00",
  "measured_on": {"model": str, "engine": str, "hardware": str, "device": str, "dtype": str},
  "prompts": {"source": "test" | "spec-bench", "path": str, "count": int, "max_new_tokens": int,
              "categories": {category: count} | null, "dropped": {reason: count}},
  "timing": {"workers": int, "torch_threads": int, "repeats": int, "how": str,
             "batch_sizes": [int],                                # decoding.batch_sizes
             "sweep_repeats": int,          # the first repeats, those with the passes at B > 1
             "worker_num_cpus": float, "worker_num_gpus": float,
             "per_worker_hardware": [str], "per_worker_peak_rss_mib": [float]},
  "drafters": {stage_subdir: {"path": str, "untrained": bool, "untrained_reasons": [str], ...}},
               # per training stage read (its output subdir): its training manifest (config,
               # versions, contract left out)
  "arms": {arm_id: ARM, ...},          # in report order (see arm_items)
  "concurrency": [ROW, ...],           # per arm (report order), per decoding.batch_sizes entry
  "sampling": {"temperatures": [float], "seed": int,    # decoding.temperatures, .sampling_seed
               "prompts": int, "how": str,              # the first decoding.sampling_prompts
               "arms": {arm_id: {"label": str, "skipped": str | null,  # why not at T > 0
                                 "by_temperature": [SAMPLED, ...]}}},   # temperatures order
  "config": {...},                     # the whole config tree
  "cost_at_scale": {...}               # optional: the cost profile's cost_profile.json
}                                      #   (peftbd.benchmarking.cost_profile.CostProfile)
ARM = {
  "label": str, "method": "ar" | method_id,    # a registered drafting method (peftbd.methods)
  "stage": str | null,    # the training stage whose output drafts (null: AR; absent in older results)
  "settings": {...},
  "repeats": [{"tokens_per_s": float, "new_tokens": int, "decode_s": float,
               "rounds": int, "mean_accepted": float}, ...],      # one per repeated run
  "tokens_per_s": STAT + {"ci95": [low, high] | null},           # STAT = {"mean", "std"}
  "mean_accepted": STAT,                # ci95: bootstrap over the prompts (benchmarking.noise)
  "speedup_vs_ar": {"mean": float, "ci95": [low, high] | null} | null,  # paired by prompt
  "mean_accepted_prefix": float | null,            # accepted draft tokens / round, bonus excluded
  "token_acceptance": float | null, "block_acceptance": float | null,
  "replay": {"rounds": int, "proposed": int, "accepted": int,        # the engine's rounds replayed
             "mean_accepted_prefix": float | null,                 # offline on these prompts +
             "token_acceptance": float | null} | null,             # AR's outputs (one-step drafters)
  "per_position": {"proposed": [int], "reached": [int], "accepted": [int],  # index j - 1, j = 1..D,
                   "rate": [float | null], "conditional": [float | null]},  # over every repeat
  "forward": {"draft": {"calls": int, "mean_ms": float | null},
              "verify": {"calls": int, "mean_ms": float | null}},   # per run (one repeat)
  "round": {"t0_s": float, "draft_ms": float, "verify_ms": float,  # ms: mean per round
            "draft_share": float, "verify_share": float, "other_share": float},
  "audit": {"prompts": int, "exact": int, "exact_pct": float, "mismatches": [{...}, ...]} | null,
                                                                   # null for AR, the reference
  "oracle": {"t0_s": float, "draft_share": float, "accepted": float,  # speculative arms only:
             "reductions": [{"r": float, "t_s": float, "tokens_per_s": float}, ...],
             "needed_accepted": {target_arm: float}} | null,  # peftbd.cost_model's output
  "by_category": {category: {"prompts": int, "tokens_per_s": STAT, "mean_accepted": STAT}}
}
SAMPLED = {"temperature": float, "tokens_per_s": float, "mean_accepted": float,  # one pass
           "mean_accepted_prefix": float | null, "token_acceptance": float | null,
           "new_tokens": int, "decode_s": float, "rounds": int, "per_position": {...},  # as ARM's
           "check": {"prompts": int, "valid": int, "invalid": [prompt_id]} | null}  # null at T = 0
ROW = {"arm": arm_id, "batch_size": int, "tokens_per_s": float, "mean_accepted": float,
       "exact": bool, "speedup_vs_ar": float | null, "wall_s": float}   # ConcurrencyRow
```

Throughput is output tokens over the summed per-prompt decode time (batch 1, prompts timed one
after another), so it does not depend on how many workers shared the prompts. `per_position` is
the engine's (`peftbd.decoding.metrics`): rate = accepted / proposed, conditional = accepted /
reached = P(accept j | accepted j - 1).

`sampling` (`peftbd.benchmarking.sampled`): per arm and temperature, the engine's run metrics
over the sampled prompts: at T > 0 of one sampled batch-1 pass (check: every output a valid sample,
within budget, ending on EOS or at the budget; losslessness is the statistical tests', not an
audit's); at T = 0 of the greedy batch-1 pass on the same prompts. Absent in older results.

`concurrency` is the batch sweep (`peftbd.benchmarking.concurrency`): aggregate throughput with
at most B requests decoding at once = generated tokens / wall time of the whole pass over the
prompts (median over repeats; at B > 1 over the first `timing.sweep_repeats`), so unlike the
arms' per-prompt tok/s it counts rows in parallel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from peftbd.methods.arm import AR
from peftbd.methods.fastmtp import ID as FASTMTP

SCHEMA = "peftbd-benchmark/3"

ORACLE_TARGETS: tuple[str, ...] = (FASTMTP, AR)
"""Arms whose measured throughput the draft-cost oracle asks each speculative arm to match (the
paper's: FastMTP and greedy AR)."""


def stat(values: Sequence[float]) -> dict[str, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    n = len(values)
    if n == 0:
        raise ValueError("stat() needs at least one value")
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return {"mean": mean, "std": math.sqrt(var)}


@dataclass(frozen=True)
class ConcurrencyRow:
    """One arm at one batch size: aggregate tok/s (median over repeats), accepted tokens per
    round (bonus included), whether every output equals greedy AR's batch-1 output for its
    prompt, tok/s over AR's at the same batch size (None without AR), and the median repeat's
    wall seconds (summed over workers)."""

    arm: str
    batch_size: int
    tokens_per_s: float
    mean_accepted: float | None
    exact: bool
    speedup_vs_ar: float | None
    wall_s: float


def concurrency_rows(results: dict[str, Any]) -> list[ConcurrencyRow]:
    """results.json's `concurrency` rows, typed (empty for results written before the sweep)."""
    return [ConcurrencyRow(**row) for row in results.get("concurrency", [])]


def arm_items(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(arm id, arm) pairs of `results`, in report order: as results.json records them, which is
    the benchmark's (`peftbd.benchmarking.arms.arm_specs`: AR, each registered method's arms in
    registration order, then the synthetic arms)."""
    return list(results.get("arms", {}).items())


def is_speculative(arm: dict[str, Any]) -> bool:
    """True for arms with a drafter (everything but greedy AR)."""
    return arm.get("method") != AR


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def draft_verify_per_round(arm: dict[str, Any]) -> float | None:
    """What drafting costs per round relative to verifying: mean draft ms per round (every draft
    call of the round) / mean verify ms per round; None for AR."""
    rnd = arm["round"]
    return _ratio(rnd["draft_ms"], rnd["verify_ms"]) if is_speculative(arm) else None


def draft_verify_per_call(arm: dict[str, Any]) -> float | None:
    """Mean draft forward ms / mean verify forward ms (one call each); None without draft calls."""
    d, v = arm["forward"]["draft"], arm["forward"]["verify"]
    return _ratio(d["mean_ms"], v["mean_ms"]) if d["calls"] else None
