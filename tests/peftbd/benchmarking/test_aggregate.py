"""results.json's acceptance per arm and per category (`aggregate.arm_entry`): tokens per round
with its interval over the prompts, position-1 acceptance and rounds, as the engine defines them."""

from __future__ import annotations

import random

import pytest

from peftbd.benchmarking.aggregate import arm_entry, category_entry
from peftbd.benchmarking.noise import acceptance_interval, acceptance_mix
from peftbd.decoding import DecodeResult, summarize
from peftbd.decoding.state import RoundMetrics
from peftbd.methods.arm import AR, ArmSpec


def _decode(accepted: list[int], proposed: int) -> DecodeResult:
    """One prompt: a round per entry of `accepted` (draft tokens accepted; + the bonus)."""
    rounds = [RoundMetrics(proposed=proposed, accepted=a, emitted=a + 1, draft_ms=1.0,
                           verify_ms=2.0, other_ms=0.5) for a in accepted]
    return DecodeResult(tokens=[1] * (1 + sum(a + 1 for a in accepted)), rounds=rounds,
                        prefill_s=0.01)


def _runs(easy: bool, n: int, seed: int, proposed: int = 4) -> list[DecodeResult]:
    rng = random.Random(seed)
    high = proposed if easy else 1
    return [_decode([rng.randint(0, high) for _ in range(8)], proposed) for _ in range(n)]


def test_each_category_has_its_interval_position_1_and_rounds() -> None:
    easy, hard = _runs(True, 6, 0), _runs(False, 6, 1)
    run = [p for pair in zip(easy, hard) for p in pair]  # categories interleaved, as dealt
    categories = ["recall", "formulaic"] * 6
    spec = ArmSpec(id="peftbd", label="PEFT-BD 1 step", method="peftbd", stage="train_peftbd")
    arm = arm_entry(spec, [run, run], categories, [])
    assert arm.mean_accepted.mean == summarize(run)["mean_accepted"]
    assert arm.mean_accepted_ci95 == acceptance_interval([run, run])
    low, high = arm.mean_accepted_ci95
    assert low < arm.mean_accepted.mean < high
    assert set(arm.by_category) == {"recall", "formulaic"}
    for cat, decodes in (("recall", easy), ("formulaic", hard)):
        c = arm.by_category[cat]
        pooled = summarize(decodes + decodes)
        assert c.prompts == 6 and c.rounds == 2 * 6 * 8 == pooled["rounds"]
        assert c.position1_acceptance == pooled["per_position"]["rate"][0] == sum(
            r.accepted >= 1 for d in decodes for r in d.rounds) / (6 * 8)
        assert c.mean_accepted_ci95 == acceptance_interval([decodes, decodes])
        assert c.mean_accepted_ci95[0] <= c.mean_accepted.mean <= c.mean_accepted_ci95[1]
    assert (arm.by_category["recall"].mean_accepted_ci95[0]
            > arm.by_category["formulaic"].mean_accepted_ci95[1])
    # the equal-weight mix: the mean of the categories' tokens per round, with its interval
    recall, formulaic = (arm.by_category[c].mean_accepted.mean for c in ("recall", "formulaic"))
    assert arm.mix_accepted == pytest.approx((recall + formulaic) / 2)
    assert (arm.mix_accepted, arm.mix_accepted_ci95) == acceptance_mix(
        [[hard, hard], [easy, easy]])  # categories in sorted order
    assert arm.mix_accepted_ci95[0] < arm.mix_accepted < arm.mix_accepted_ci95[1]


def test_the_mix_weighs_a_small_category_as_much_as_a_large_one() -> None:
    easy, hard = _runs(True, 3, 3), _runs(False, 12, 4)
    spec = ArmSpec(id="peftbd", label="PEFT-BD 1 step", method="peftbd", stage="train_peftbd")
    arm = arm_entry(spec, [easy + hard], ["recall"] * 3 + ["formulaic"] * 12, [])
    recall, formulaic = (summarize(d)["mean_accepted"] for d in (easy, hard))
    assert arm.mix_accepted == pytest.approx((recall + formulaic) / 2)
    assert arm.mean_accepted.mean == pytest.approx(summarize(easy + hard)["mean_accepted"])
    assert arm.mix_accepted > arm.mean_accepted.mean  # the pooled prompts lean to the large one
    assert arm_entry(spec, [easy + hard], [None] * 15, []).mix_accepted is None  # no categories


def test_ar_has_no_acceptance_interval_and_no_position_1() -> None:
    run = [_decode([0] * 5, proposed=0) for _ in range(4)]
    arm = arm_entry(ArmSpec(id=AR, label="AR", method=AR), [run], ["qa"] * 4, [])
    assert arm.mean_accepted.mean == 1.0 and arm.mean_accepted_ci95 is None
    assert arm.mix_accepted is None and arm.mix_accepted_ci95 is None
    c = arm.by_category["qa"]
    assert c.mean_accepted_ci95 is None and c.position1_acceptance is None and c.rounds == 20


def test_a_category_of_one_prompt_has_no_interval() -> None:
    c = category_entry([_runs(True, 1, 2)], speculative=True)
    assert c.prompts == 1 and c.mean_accepted_ci95 is None
    assert c.position1_acceptance == pytest.approx(
        summarize(_runs(True, 1, 2))["per_position"]["rate"][0])
