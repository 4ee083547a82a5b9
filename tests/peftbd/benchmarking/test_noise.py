"""Intervals over the prompts (`peftbd.intervals`) for batch-1 throughput, speedup, tokens per round
and its equal-weight mix over categories."""

from __future__ import annotations

import random

import pytest

from peftbd.benchmarking.noise import (
    acceptance_interval,
    acceptance_mix,
    round_totals,
    speedup_interval,
    throughput_interval,
)
from peftbd.decoding import DecodeResult, summarize
from peftbd.decoding.state import RoundMetrics
from peftbd.intervals import equal_weight_interval, ratio_interval, ratio_of_ratios_interval


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


def _decode(emitted: list[int], proposed: int = 4) -> DecodeResult:
    """One prompt's decode: a round per entry of `emitted` (tokens it committed, the bonus
    included), each proposing `proposed` draft tokens."""
    rounds = [RoundMetrics(proposed=proposed, accepted=e - 1, emitted=e, draft_ms=1.0,
                           verify_ms=1.0) for e in emitted]
    return DecodeResult(tokens=[1] * (1 + sum(emitted)), rounds=rounds, prefill_s=0.01)


def _prompts(n: int, seed: int) -> list[DecodeResult]:
    rng = random.Random(seed)
    return [_decode([rng.randint(1, 5) for _ in range(rng.randint(3, 12))]) for _ in range(n)]


def test_the_acceptance_interval_holds_the_engine_s_tokens_per_round_and_is_deterministic() -> None:
    run = _prompts(32, 3)
    run[0].rounds.append(RoundMetrics(proposed=4, accepted=2, emitted=2))  # ended in its draft
    low, high = acceptance_interval([run])
    point = summarize(run)["mean_accepted"]  # the engine's: emitted / rounds, bonus included
    assert point == sum(r.emitted for res in run for r in res.rounds) / sum(
        len(res.rounds) for res in run)
    assert low < point < high
    assert acceptance_interval([run]) == (low, high)


def test_the_acceptance_interval_has_no_width_when_every_prompt_has_the_same_tokens_per_round() -> None:
    """2 tokens per round on every prompt, however many rounds each took and however the rounds
    within a prompt differ: every resample is 2."""
    run = [_decode([2] * 5), _decode([1, 3]), _decode([4, 1, 1, 2, 2]), _decode([2, 2, 2])]
    assert acceptance_interval([run]) == (2.0, 2.0)


def test_the_acceptance_interval_narrows_with_more_prompts() -> None:
    few = acceptance_interval([_prompts(16, 4)])
    many = acceptance_interval([_prompts(256, 4)])
    assert many[1] - many[0] < (few[1] - few[0]) / 2


def test_acceptance_repeats_are_pooled_and_prompts_without_a_round_left_out() -> None:
    run = _prompts(12, 5)
    once = acceptance_interval([run])
    assert acceptance_interval([run, run]) == pytest.approx(once)
    ended_at_prefill = DecodeResult(tokens=[7], rounds=[], prefill_s=0.01)
    assert acceptance_interval([[*run, ended_at_prefill]]) == once
    assert acceptance_interval([[run[0], ended_at_prefill]]) is None  # one prompt with rounds
    assert acceptance_interval([run[:1]]) is None


def test_the_intervals_are_the_project_s_over_each_prompt_s_pooled_totals() -> None:
    rng = random.Random(6)
    ar_seconds = [rng.uniform(0.2, 1.0) for _ in range(12)]
    arm = [_run([s / rng.uniform(1.5, 2.5) for s in ar_seconds])]
    tokens, seconds = [100.0] * 12, [r.decode_s for r in arm[0]]
    assert throughput_interval(arm) == ratio_interval(tokens, seconds)
    assert speedup_interval(arm, [_run(ar_seconds)]) == ratio_of_ratios_interval(
        tokens, seconds, tokens, [r.decode_s for r in _run(ar_seconds)])
    run = _prompts(12, 7)
    emitted = [sum(r.emitted for r in res.rounds) for res in run]
    assert acceptance_interval([run]) == ratio_interval(emitted, [len(res.rounds) for res in run])


def test_the_mix_weighs_each_category_equally() -> None:
    """A category of 4 easy prompts and one of 20 hard ones: the mix is the mean of the two
    categories' tokens per round, not the pooled prompts' (which the hard ones dominate)."""
    rng = random.Random(8)
    easy = [_decode([4] * 10) for _ in range(3)] + [_decode([3] * 10)]
    hard = [_decode([rng.choice([1, 1, 2]) for _ in range(rng.randint(20, 40))])
            for _ in range(20)]
    mix, interval = acceptance_mix([[easy], [hard]])
    per_category = [summarize(easy)["mean_accepted"], summarize(hard)["mean_accepted"]]
    assert mix == pytest.approx(sum(per_category) / 2)
    assert mix > summarize(easy + hard)["mean_accepted"] + 0.5
    assert interval == equal_weight_interval([round_totals([easy]), round_totals([hard])])[1]
    assert interval is not None and interval[0] < mix < interval[1]
    again, twice = acceptance_mix([[easy, easy], [hard, hard]]) or (None, None)
    assert again == pytest.approx(mix) and twice == pytest.approx(interval)  # repeats pooled


def test_no_mix_without_categories_or_rounds_and_no_interval_from_a_one_prompt_category() -> None:
    hard, ended_at_prefill = _prompts(6, 9), DecodeResult(tokens=[7], rounds=[], prefill_s=0.01)
    assert acceptance_mix([]) is None
    assert acceptance_mix([[hard], [[ended_at_prefill]]]) is None
    mix, interval = acceptance_mix([[hard], [hard[:1]]]) or (None, None)
    assert interval is None and mix == pytest.approx(
        (summarize(hard)["mean_accepted"] + summarize(hard[:1])["mean_accepted"]) / 2)
