"""Bootstrap intervals over the prompts for batch-1 throughput and speedup."""

from __future__ import annotations

import random

import pytest

from peftbd.benchmarking.noise import speedup_interval, throughput_interval
from peftbd.decoding import DecodeResult


def _run(seconds: list[float], tokens: int = 100) -> list[DecodeResult]:
    return [DecodeResult(tokens=[1] * tokens, rounds=[], prefill_s=s) for s in seconds]


def test_the_interval_holds_the_measured_throughput_and_is_deterministic() -> None:
    rng = random.Random(0)
    seconds = [rng.uniform(0.2, 0.6) for _ in range(32)]
    runs = [_run(seconds)]
    low, high = throughput_interval(runs)
    point = 100 * 32 / sum(seconds)
    assert low < point < high
    assert throughput_interval(runs) == (low, high)


def test_the_interval_narrows_with_uniform_prompts() -> None:
    rng = random.Random(1)
    noisy = throughput_interval([_run([rng.uniform(0.1, 0.9) for _ in range(32)])])
    steady = throughput_interval([_run([0.5 + rng.uniform(-0.01, 0.01) for _ in range(32)])])
    assert steady[1] - steady[0] < (noisy[1] - noisy[0]) / 10


def test_repeats_of_a_prompt_are_pooled_not_counted_as_prompts() -> None:
    seconds = [0.1 * (i + 1) for i in range(8)]
    once = throughput_interval([_run(seconds)])
    twice = throughput_interval([_run(seconds), _run(seconds)])
    assert twice == pytest.approx(once)


def test_the_speedup_is_paired_prompt_by_prompt() -> None:
    """An arm exactly 2x faster than AR on every prompt has a speedup interval of [2, 2], however
    different the prompts are from each other."""
    rng = random.Random(2)
    ar_seconds = [rng.uniform(0.1, 2.0) for _ in range(32)]
    arm = [_run([s / 2 for s in ar_seconds])]
    assert speedup_interval(arm, [_run(ar_seconds)]) == pytest.approx([2.0, 2.0])
    assert throughput_interval(arm)[1] / throughput_interval(arm)[0] > 1.1


def test_no_interval_from_one_prompt_or_unpaired_prompts() -> None:
    assert throughput_interval([_run([0.5])]) is None
    assert speedup_interval([_run([0.5, 0.6])], [_run([0.5, 0.6, 0.7])]) is None
