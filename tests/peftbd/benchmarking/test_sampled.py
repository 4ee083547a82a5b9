"""Acceptance under sampling: seeds, the sample check, which temperatures and prompts are sampled,
and results.json's `sampling` block from hand-made decodes."""

from __future__ import annotations

import pytest

from peftbd.benchmarking.arms import arm_specs
from peftbd.benchmarking.prompts import Prompt
from peftbd.benchmarking.sampled import (
    SKIPPED,
    SampledPass,
    prompt_seed,
    sampled_prompts,
    sampled_temperatures,
    sampling_block,
    valid_sample,
)
from peftbd.benchmarking.schema import Check
from peftbd.config import ConfigError, load_config
from peftbd.decoding import DecodeResult, RoundMetrics

EOS = [7]


def _decode(emitted: list[tuple[int, int]], seconds: float = 0.01) -> DecodeResult:
    """A decode of rounds (proposed, accepted), each emitting accepted + 1, one token each."""
    rounds = [RoundMetrics(p, a, a + 1, verify_ms=seconds * 1e3) for p, a in emitted]
    return DecodeResult(tokens=[1] * sum(a + 1 for _, a in emitted), rounds=rounds)


def test_seeds_depend_on_the_run_seed_and_the_prompt_id_only():
    assert prompt_seed(0, "p1") == prompt_seed(0, "p1")
    assert len({prompt_seed(s, p) for s in (0, 1) for p in ("p1", "p2")}) == 4
    assert 0 <= prompt_seed(5, "p1") < 2 ** 63


@pytest.mark.parametrize("tokens,valid", [
    ([3, 4, 7], True),  # ends on EOS
    ([3, 4, 5, 6], True),  # ends at the budget (4)
    ([3, 4], False),  # neither
    ([], False),
    ([3, 7, 4, 7], False),  # an EOS before the last token
    ([3, 4, 5, 6, 7], False),  # over the budget
    ([3, 99, 7], False),  # outside the vocabulary (50)
])
def test_a_valid_sample_stays_in_budget_and_vocabulary_and_ends_on_eos_or_the_budget(tokens, valid):
    assert valid_sample(tokens, EOS, budget=4, vocab=50) is valid


def test_sampled_temperatures_and_prompts_come_from_the_decoding_config():
    cfg = load_config("tiny", overrides=["decoding.temperatures=[0, 0.7, 1]",
                                         "decoding.sampling_prompts=2"])
    assert sampled_temperatures(cfg) == (0.7, 1.0)
    prompts = [Prompt(f"p{i}", [i]) for i in range(5)]
    assert [p.id for p in sampled_prompts(cfg, prompts)] == ["p0", "p1"]
    every = load_config("tiny", overrides=["decoding.sampling_prompts=0"])
    assert sampled_prompts(every, prompts) == prompts
    with pytest.raises(ConfigError, match="decoding.temperatures.*decodes greedily"):
        sampled_temperatures(load_config("tiny", overrides=["decoding.temperatures=[0, 1e-6]"]))


def test_the_block_holds_every_arm_per_temperature_and_skips_synthetic_arms_above_zero():
    specs = {s.id: s for s in arm_specs(load_config("tiny"))}
    chosen = [specs["ar"], specs["peftbd"], specs["peftbd_synthetic"]]
    greedy = {"ar": [_decode([(0, 0)] * 4)],
              "peftbd": [_decode([(4, 3), (4, 1)])],  # 6 tokens in 2 rounds: 3.0 per round
              "peftbd_synthetic": [_decode([(4, 2)])]}
    passes = [SampledPass("ar", 1.0, [_decode([(0, 0)] * 3)], []),
              SampledPass("peftbd", 1.0, [_decode([(4, 1), (4, 0)])], ["p2"]),  # two workers
              SampledPass("peftbd", 1.0, [_decode([(4, 0)], seconds=0.02)], [])]
    block = sampling_block(chosen, [0.0, 1.0], 3, 2, greedy, passes)

    assert (block.temperatures, block.seed, block.prompts) == ([0.0, 1.0], 3, 2)
    arms = block.arms
    assert list(arms) == ["ar", "peftbd", "peftbd_synthetic"]
    greedy_0, sampled_1 = arms["peftbd"].by_temperature
    assert (greedy_0.temperature, greedy_0.mean_accepted, greedy_0.check) == (0.0, 3.0, None)
    assert sampled_1.temperature == 1.0 and sampled_1.rounds == 3
    assert sampled_1.mean_accepted == pytest.approx(4 / 3)  # (2 + 1 + 1) tokens / 3 rounds
    position = sampled_1.per_position
    assert (position.proposed[0], position.accepted[0]) == (3, 1)
    assert sampled_1.check == Check(prompts=2, valid=1, invalid=["p2"])
    assert sampled_1.new_tokens == 4 and sampled_1.tokens_per_s == pytest.approx(4 / 0.04)
    assert [e.mean_accepted for e in arms["ar"].by_temperature] == [1.0, 1.0]
    synthetic = arms["peftbd_synthetic"]
    assert synthetic.skipped == SKIPPED and arms["peftbd"].skipped is None
    assert [e.temperature for e in synthetic.by_temperature] == [0.0]  # T = 0 only
