"""The concurrency rows from timed passes: tokens and wall time summed over workers per repeat,
the median over repeats, speedup over AR at the same batch size, exactness over every pass."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pydantic import TypeAdapter

from peftbd.benchmarking.concurrency import BatchRun, batch_run, concurrency_rows
from peftbd.benchmarking.schema import ConcurrencyRow, Results
from peftbd.decoding import DecodeResult
from peftbd.decoding.state import RoundMetrics


def _run(arm: str, b: int, repeat: int, wall: float, tokens: int = 100, exact: int = 2) -> BatchRun:
    return BatchRun(arm, b, repeat, wall, tokens, rounds=50, emitted=tokens - 2, exact=exact,
                    prompts=2)


def test_rows_sum_workers_take_the_median_and_divide_by_ar() -> None:
    runs = []
    for worker in range(2):  # two workers, same walls: per repeat 200 tokens / (2 x wall)
        for repeat, (ar_wall, spec_wall) in enumerate([(1.0, 0.5), (2.0, 0.4), (0.5, 0.8)]):
            runs += [_run("ar", 1, repeat, ar_wall), _run("peftbd", 1, repeat, spec_wall),
                     _run("ar", 4, repeat, 0.25), _run("peftbd", 4, repeat, 0.5,
                                                        exact=1 if worker else 2)]
    rows = concurrency_rows(runs, ["ar", "peftbd"], [1, 4])
    assert [(r.arm, r.batch_size) for r in rows] == [("ar", 1), ("ar", 4), ("peftbd", 1), ("peftbd", 4)]
    ar_1, ar_4, spec_1, spec_4 = rows
    assert ar_1.tokens_per_s == pytest.approx(100.0)  # median of 100, 50, 200
    assert ar_1.wall_s == pytest.approx(2.0)  # median of 2, 4, 1 (summed over the workers)
    assert spec_1.tokens_per_s == pytest.approx(200.0)  # median of 200, 250, 125
    assert spec_1.speedup_vs_ar == pytest.approx(2.0) and ar_1.speedup_vs_ar == 1.0
    assert ar_4.tokens_per_s == pytest.approx(400.0) and spec_4.speedup_vs_ar == pytest.approx(0.5)
    assert spec_4.mean_accepted == pytest.approx(98 / 50)
    assert spec_1.exact and not spec_4.exact  # one worker's pass had a mismatch


def test_a_missing_batch_1_pass_is_an_error_an_unswept_batched_one_is_no_row() -> None:
    with pytest.raises(ValueError, match="no timed run of arm 'peftbd' at batch size 1"):
        concurrency_rows([_run("ar", 1, 0, 1.0)], ["ar", "peftbd"], [1, 4])
    runs = [_run("ar", 1, 0, 1.0), _run("peftbd_2step", 1, 0, 2.0), _run("ar", 4, 0, 0.5)]
    rows = concurrency_rows(runs, ["ar", "peftbd_2step"], [1, 4])  # a variant the sweep skips
    assert [(r.arm, r.batch_size) for r in rows] == [("ar", 1), ("ar", 4), ("peftbd_2step", 1)]


def test_the_sweep_covers_variants_only_when_asked() -> None:
    """`swept`: AR and each method's own arm always; a variant (its id not its method's) only
    with decoding.sweep_variants."""
    from peftbd.benchmarking.runner import swept
    from peftbd.methods.arm import AR_ARM, ArmSpec

    own, variant = ArmSpec("peftbd", "PEFT-BD", "peftbd"), ArmSpec("peftbd_2step", "2 steps", "peftbd")
    synthetic = ArmSpec("fastmtp_synthetic", "FastMTP synthetic", "fastmtp", synthetic=1.5)
    assert [swept(s, False) for s in (AR_ARM, own, variant, synthetic)] == [True, True, False, False]
    assert all(swept(s, True) for s in (AR_ARM, own, variant, synthetic))


def test_batch_run_counts_tokens_rounds_and_exact_prompts() -> None:
    rounds = [RoundMetrics(proposed=3, accepted=2, emitted=3), RoundMetrics(3, 0, 1)]
    decoded = [DecodeResult([1, 2, 3, 4, 5], rounds), DecodeResult([7, 8], rounds[1:])]
    run = batch_run("peftbd", 4, 0, 0.5, decoded, [[1, 2, 3, 4, 5], [7, 9]])
    assert (run.new_tokens, run.rounds, run.emitted, run.exact, run.prompts) == (7, 3, 5, 1, 2)
    with pytest.raises(ValueError, match="2 decodes for 1 reference"):
        batch_run("peftbd", 4, 0, 0.5, decoded, [[1]])


def test_rows_round_trip_through_results_json() -> None:
    row = ConcurrencyRow("peftbd", 16, 812.5, 2.4, True, 0.91, 3.2)
    rows = TypeAdapter(list[ConcurrencyRow])
    assert rows.validate_json(json.dumps([dataclasses.asdict(row)])) == [row]
    field = Results.model_fields["concurrency"]  # results written before the sweep have none
    assert field.get_default(call_default_factory=True) == []
