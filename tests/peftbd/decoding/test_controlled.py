"""Controlled (synthetic) acceptance: real drafter forwards, the profile's acceptance, AR's output."""

from __future__ import annotations

import random
import statistics

import pytest
import torch

from peftbd.decoding import MTPDrafter, PeftBDDrafter, SpeculativeDecoder
from peftbd.decoding.controlled import AcceptanceProfile, ControlledDrafter, reference_oracle
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import attach_drafter_adapter

BUDGET = 96


@pytest.fixture(scope="module")
def rows(prompts) -> list[list[int]]:
    """Twelve prompts: corpus prompts and cuts of them (AR's outputs differ per prompt)."""
    base = [ids for _, ids in prompts]
    return [p[: len(p) - cut] for p in base for cut in (0, 2, 4, 6)]


@pytest.fixture(scope="module")
def setup(tiny_cfg, tokenizer, verifier, rows, eos):
    """(adapter-carrying verifier, untrained PEFT-BD and FastMTP drafters, the AR oracle)."""
    from peftbd.models.loading import load_verifier

    torch.manual_seed(0)
    model = attach_drafter_adapter(load_verifier(tiny_cfg), tiny_cfg.peftbd, tokenizer.mask_token_id)
    ar = SpeculativeDecoder(model, None, eos, BUDGET)
    refs = {tuple(p): r.tokens for p, r in zip(rows, ar.decode_many(rows, 4))}
    inner = {"peftbd": PeftBDDrafter(model, tokenizer.mask_token_id, 8),
             "fastmtp": MTPDrafter(MTPHead(model), model, num_steps=3)}
    return model, inner, reference_oracle(refs), refs


def _mid_rounds(results):
    """Every round but each request's last (which the output's end may cut)."""
    return [r for res in results for r in res.rounds[:-1]]


def test_the_mean_picks_the_geometric_rate_that_gives_it():
    for mean, positions in ((2.881, 16), (1.511, 3), (5.3, 16), (1.0, 4), (17.0, 16)):
        profile = AcceptanceProfile.with_mean(mean, positions)
        assert profile.expected_emitted() == pytest.approx(mean, abs=1e-9)
        assert len(set(profile.conditional)) == 1 and len(profile.conditional) == positions
    assert AcceptanceProfile.geometric(0.5, 3).expected_emitted() == pytest.approx(1.875)


def test_bad_profiles_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="out of reach"):
        AcceptanceProfile.with_mean(4.5, 3)
    with pytest.raises(ValueError, match=r"rates in \[0, 1\]"):
        AcceptanceProfile((0.5, 1.2), "bad")
    assert AcceptanceProfile.measured([0.5, None], "run").conditional == (0.5, 0.0)


def test_draws_follow_the_profile():
    profile = AcceptanceProfile((0.9, 0.5, 0.25, 0.0), "steps")
    rng = random.Random(0)
    draws = [profile.draw(4, rng) for _ in range(20_000)]
    want = {0: 0.1, 1: 0.9 * 0.5, 2: 0.9 * 0.5 * 0.75, 3: 0.9 * 0.5 * 0.25, 4: 0.0}
    for k, p in want.items():
        share = draws.count(k) / len(draws)
        assert share == pytest.approx(p, abs=4 * (p * (1 - p) / len(draws)) ** 0.5 + 1e-9), k


@pytest.mark.parametrize("name,mean", [("peftbd", 3.0), ("fastmtp", 2.2)])
def test_real_drafts_at_the_profiles_acceptance_give_ar_output(setup, rows, eos, name, mean):
    model, inner, oracle, refs = setup
    positions = 8 if name == "peftbd" else 3
    profile = AcceptanceProfile.with_mean(mean, positions)
    dec = SpeculativeDecoder(model, ControlledDrafter(inner[name], profile, oracle), eos, BUDGET)
    results = dec.decode_many(rows, 4)
    assert [r.tokens for r in results] == [refs[tuple(p)] for p in rows]  # exact: AR's output
    rounds = [r for r in _mid_rounds(results) if r.proposed == positions]
    emitted = [r.emitted for r in rounds]
    se = statistics.stdev(emitted) / len(emitted) ** 0.5
    assert len(rounds) > 100
    assert statistics.mean(emitted) == pytest.approx(mean, abs=4 * se), (len(rounds), se)
    # real drafts: a forward every round but a last one with no room for a draft
    assert all(res.forward_calls.get("draft", 0) >= len(res.rounds) - 1 for res in results)


def test_a_request_accepts_the_same_way_at_any_batch_size(setup, rows, eos):
    model, inner, oracle, _ = setup
    budget = BUDGET // 3  # a dozen rounds per request: plenty of draws to tell seeds apart
    drafter = ControlledDrafter(inner["peftbd"], AcceptanceProfile.with_mean(2.5, 8), oracle, seed=3)
    dec = SpeculativeDecoder(model, drafter, eos, budget)
    accepted = {b: [[r.accepted for r in res.rounds] for res in dec.decode_many(rows[:6], b)]
                for b in (1, 3, 6)}
    assert accepted[1] == accepted[3] == accepted[6]
    other = ControlledDrafter(inner["peftbd"], drafter.profile, oracle, seed=4)
    assert [[r.accepted for r in res.rounds]
            for res in SpeculativeDecoder(model, other, eos, budget).decode_many(rows[:6], 6)] \
        != accepted[1]  # the seed decides the draws


def test_the_oracle_names_a_prompt_it_does_not_know(setup, rows, eos):
    model, inner, oracle, _ = setup
    drafter = ControlledDrafter(inner["peftbd"], AcceptanceProfile.with_mean(2.0, 8), oracle)
    with pytest.raises(KeyError, match="greedy AR output"):
        SpeculativeDecoder(model, drafter, eos, 8).decode(rows[0] + [5])


def test_controlled_acceptance_refuses_a_sampled_request(setup, rows, eos):
    from peftbd.decoding import SamplingParams

    model, inner, oracle, _ = setup
    drafter = ControlledDrafter(inner["peftbd"], AcceptanceProfile.with_mean(2.0, 8), oracle)
    with pytest.raises(ValueError, match="temperature 0"):
        SpeculativeDecoder(model, drafter, eos, 8).decode_many(
            [rows[0]], 1, sampling=SamplingParams(temperature=1.0, seed=0))
