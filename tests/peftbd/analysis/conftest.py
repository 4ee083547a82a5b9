"""Synthetic results.json in its types (`peftbd.benchmarking.schema.Results`): arms are built as
JSON dicts (a test may change one before it goes in) and `make_results` validates the whole."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

from peftbd.benchmarking.cost_profile_schema import CostProfile
from peftbd.benchmarking.schema import SCHEMA, Results

ArmMaker = Callable[..., dict[str, Any]]


def stat(values: list[float]) -> dict[str, float]:
    """The JSON form of `peftbd.benchmarking.schema.stat`."""
    from peftbd.benchmarking.schema import stat as typed

    return typed(values).model_dump()


def _per_position(accepted: list[int], rounds: int = 100) -> dict[str, list]:
    """Counts of `rounds` rounds that each proposed len(accepted) positions (reached j = accepted
    j - 1)."""
    proposed = [rounds] * len(accepted)
    reached = [rounds, *accepted[:-1]] if accepted else []
    return {"proposed": proposed, "reached": reached, "accepted": accepted,
            "rate": [a / p for a, p in zip(accepted, proposed)],
            "conditional": [a / n if n else None for a, n in zip(accepted, reached)]}


def make_arm(label: str, method: str, tps: list[float], accepted: float, *,
             draft_call_ms: float | None = None, verify_call_ms: float = 2.5, calls: int = 420,
             round_ms: tuple[float, float] = (2.7, 2.5), accepted_per_position: list[int] | None = None,
             free: float | None = None, needed: tuple[float, float] = (1.7, 2.9),
             accepted_ci95: tuple[float, float] | None = None) -> dict[str, Any]:
    """One arm; `accepted_per_position` over 100 rounds that each proposed every position;
    `free` overrides the oracle's r = 1 throughput, `needed` = (vs FastMTP, vs AR);
    `accepted_ci95` the interval of tokens per round (default: accepted -0.05/+0.04, AR none),
    also its one category's ("qa", 2 prompts)."""
    spec = method != "ar"
    if accepted_ci95 is None and spec:
        accepted_ci95 = (accepted - 0.05, accepted + 0.04)
    p1 = (accepted_per_position[0] / 100 if accepted_per_position else 0.5) if spec else None
    reductions = [{"r": r, "t_s": 0.006 * (1 - r * 0.45),
                   "tokens_per_s": accepted / (0.006 * (1 - r * 0.45))} for r in (0.0, 0.5, 1.0)]
    if free is not None:
        reductions[-1]["tokens_per_s"] = free
    return {
        "label": label, "method": method, "stage": None, "settings": {},
        "repeats": [{"tokens_per_s": t, "new_tokens": 480, "decode_s": 480 / t, "rounds": calls,
                     "mean_accepted": accepted} for t in tps],
        "tokens_per_s": stat(tps), "mean_accepted": stat([accepted] * len(tps)),
        "mean_accepted_ci95": accepted_ci95, "speedup_vs_ar": None, "mean_accepted_prefix": accepted - 1,
        "token_acceptance": 0.25 if spec else None, "block_acceptance": 0.0 if spec else None,
        "per_position": _per_position(accepted_per_position or []),
        "forward": {"draft": {"calls": calls if spec else 0, "mean_ms": draft_call_ms},
                    "verify": {"calls": calls, "mean_ms": verify_call_ms}},
        "round": {"t0_s": 0.006, "draft_ms": round_ms[0], "verify_ms": round_ms[1],
                  "draft_share": 0.45, "verify_share": 0.45, "other_share": 0.1},
        "audit": {"prompts": 16, "exact": 16, "exact_pct": 100.0, "mismatches": []} if spec else None,
        "oracle": {"t0_s": 0.006, "draft_share": 0.45, "accepted": accepted, "reductions": reductions,
                   "needed_accepted": {"fastmtp": needed[0], "ar": needed[1]}} if spec else None,
        "by_category": {"qa": {"prompts": 2, "tokens_per_s": stat(tps), "mean_accepted":
                               stat([accepted] * len(tps)), "mean_accepted_ci95": accepted_ci95,
                               "position1_acceptance": p1, "rounds": calls * len(tps)}},
    }


def make_results(arms: dict[str, dict[str, Any]], block_size: int = 4, **fields: Any) -> Results:
    """A results.json around `arms` ({arm id: arm}); `fields` replace top-level keys."""
    return Results.model_validate({
        "schema": SCHEMA, "preset": "tiny", "created": "2025-01-01T00:00:00+00:00",
        "measured_on": {"model": "embedded:tiny", "engine": "peftbd loop", "hardware": "test CPU",
                        "device": "cpu", "dtype": "float32"},
        "prompts": {"source": "test", "path": "/a/continuations", "count": 16,
                    "max_new_tokens": 48, "categories": None, "dropped": {}},
        "timing": {"workers": 1, "torch_threads": 2, "repeats": 3, "how": "serial",
                   "worker_num_cpus": 2.0, "worker_num_gpus": 0.0, "batch_sizes": [1],
                   "sweep_repeats": 1, "per_worker_hardware": ["test CPU"],
                   "per_worker_peak_rss_mib": [100.0]},
        "drafters": {},
        "arms": arms,
        "config": {"peftbd": {"block_size": block_size, "prefix_gamma": 0.9}},
        **fields,
    })


@pytest.fixture
def arm() -> ArmMaker:
    """`make_arm`."""
    return make_arm


@pytest.fixture
def results_of() -> Callable[..., Results]:
    """`make_results`."""
    return make_results


def sample() -> Results:
    """AR, PEFT-BD (D = 4) and FastMTP (3 steps) with distinct recognisable numbers."""
    return make_results({
        "ar": make_arm("AR", "ar", [401.5, 399.5, 400.0], 1.0, calls=768, round_ms=(0.01, 2.5)),
        "peftbd": make_arm("PEFT-BD 1 step", "peftbd", [123.25, 121.75, 122.5], 1.37,
                           draft_call_ms=2.61, accepted_per_position=[60, 30, 12, 4]),
        "fastmtp": make_arm("FastMTP", "fastmtp", [311.0, 309.0, 310.0], 1.81, draft_call_ms=0.4,
                            calls=300, round_ms=(1.3, 2.5), accepted_per_position=[70, 45, 25]),
    })


@pytest.fixture
def sample_results() -> Results:
    """`sample()`."""
    return sample()


EAGER_CPU = {"device": "cpu", "dtype": "float32", "paths": {"verify": "eager"},
             "cuda_graph_replays": None, "cuda_graph_skips": None}
"""A cost profile arm's `ArmRun` fields: eager on a CPU in float32."""


@pytest.fixture
def eager_cpu() -> dict[str, Any]:
    return copy.deepcopy(EAGER_CPU)


def make_cost_profile(draft_over_verify: dict[str, tuple[float, float]]) -> CostProfile:
    """A cost profile holding {arm: (draft ms, verify ms)} per round at float32, eager on a CPU."""
    arms = {a: {**EAGER_CPU, "label": a, "method": a, "proposed": 4, "kv_len": 512,
                "draft_calls": int(d > 0), "draft_ms_round": d, "verify_ms_round": v,
                "draft_over_verify_round": d / v,
                "draft_ms_round_min": d, "verify_ms_round_min": v}
            for a, (d, v) in draft_over_verify.items()}
    work = {a: {"draft_forwards": int(d > 0), "draft_gflops": d, "draft_mb": d, "verify_gflops": v,
                "verify_mb": v, "roofline_draft_ms": d / 100, "roofline_verify_ms": v / 100,
                "roofline_draft_over_verify": d / v, "largest_draft_tensor": 1}
            for a, (d, v) in draft_over_verify.items()}
    return CostProfile.from_dict({
        "architecture": {"name": "Qwen/Qwen3-0.6B", "layers": 28, "hidden_size": 1024,
                         "vocab_size": 151936, "parameters": 596_000_000, "origin": "embedded config",
                         "weights": "random"},
        "device": "cpu", "hardware": "CPU", "threads": 2, "kv_len": 512, "repeats": 3,
        "block_size": 4, "early_exit_layers": 1, "mtp_steps": 3,
        "profiles": {"float32": {"dtype": "float32", "arms": arms,
                                 "mask_row": {"peft_wrappers_ms": 9.0, "engine_ms": 1.0}}},
        "roofline": {"gpu": {"name": "H200", "hbm_bytes_per_s": 4.8e12,
                             "bf16_flops_per_s": 989e12}, "arms": work}})


@pytest.fixture
def cost_profile_of() -> Callable[[dict[str, tuple[float, float]]], CostProfile]:
    return make_cost_profile
