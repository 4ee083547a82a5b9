"""The loop: exact greedy output with any drafter, predictable acceptance, EOS and budget."""

from __future__ import annotations

import pytest
import torch

from peftbd.decoding import (DecodeResult, MTPDrafter, PeftBDDrafter, SpeculativeDecoder, decode,
                             summarize)
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import attach_drafter_adapter

N = 20  # generated tokens per prompt in budget-bound tests (EOS off)


@pytest.fixture(scope="module")
def ar_outputs(verifier, prompts, eos):
    return {pid: decode(verifier, ids, None, 32, eos).tokens for pid, ids in prompts}


@pytest.fixture(scope="module")
def peft_verifier(tiny_cfg, tokenizer):
    """The verifier with an untrained drafter adapter (a separate copy: attaching is in place)."""
    from peftbd.models.loading import load_verifier

    torch.manual_seed(0)
    return attach_drafter_adapter(load_verifier(tiny_cfg), tiny_cfg.peftbd, tokenizer.mask_token_id)


@pytest.mark.parametrize("steps,anchored", [(1, False), (2, False), (1, True)])
def test_untrained_peftbd_equals_ar(peft_verifier, tokenizer, prompts, eos, ar_outputs, steps, anchored):
    drafter = PeftBDDrafter(peft_verifier, tokenizer.mask_token_id, 8, steps, anchored)
    results = []
    for pid, ids in prompts:
        result = decode(peft_verifier, ids, drafter, 32, eos)
        assert result.tokens == ar_outputs[pid]
        assert result.metrics["forward"]["draft"]["calls"] == steps * sum(
            r.proposed > 0 for r in result.rounds)
        results.append(result)
    rounds = [r for res in results for r in res.rounds]
    pos = summarize(results)["per_position"]
    assert len(pos["proposed"]) == 8
    assert sum(pos["accepted"]) == sum(r.accepted for r in rounds)  # the counts add up
    assert sum(pos["proposed"]) == sum(r.proposed for r in rounds)
    assert all(0 <= x <= 1 for x in pos["rate"]) and pos["rate"][0] is not None
    assert all(x is None or 0 <= x <= 1 for x in pos["conditional"])  # None: never reached
    full = summarize([DecodeResult([], [r for r in rounds if r.proposed == 8])])["per_position"]
    assert full["rate"] == sorted(full["rate"], reverse=True)  # longest prefix: non-increasing


def test_untrained_mtp_equals_ar(verifier, prompts, eos, ar_outputs):
    torch.manual_seed(0)
    drafter = MTPDrafter(MTPHead(verifier), verifier, num_steps=3)
    for pid, ids in prompts:
        result = decode(verifier, ids, drafter, 32, eos)
        assert result.tokens == ar_outputs[pid]
        assert all(r.proposed <= 3 for r in result.rounds)


def test_oracle_drafter_gets_every_token_accepted(scripted, verifier, prompts):
    ids = prompts[0][1]
    truth = decode(verifier, ids, None, N).tokens
    assert len(truth) == N
    result = decode(verifier, ids, scripted(truth, block=4), N)
    assert result.tokens == truth
    # prefill gives token 1; then every round proposes min(4, left - 1) and emits all + the bonus
    assert [(r.proposed, r.accepted, r.emitted) for r in result.rounds] == [(4, 4, 5)] * 3 + [(3, 3, 4)]
    m = result.metrics
    assert m["token_acceptance"] == 1.0 and m["block_acceptance"] == 1.0
    assert m["mean_accepted"] == (N - 1) / 4


def test_always_wrong_drafter_gets_exactly_the_bonus(scripted, verifier, prompts):
    ids = prompts[1][1]
    truth = decode(verifier, ids, None, N).tokens
    result = decode(verifier, ids, scripted(truth, block=4, wrong_from=0), N)
    assert result.tokens == truth
    assert len(result.rounds) == N - 1
    assert all(r.accepted == 0 and r.emitted == 1 for r in result.rounds)
    assert [r.proposed for r in result.rounds] == [min(4, N - 2 - i) for i in range(N - 1)]
    assert result.metrics["token_acceptance"] == 0.0 and result.metrics["mean_accepted"] == 1.0


def test_partial_acceptance_counts(scripted, verifier, prompts):
    ids = prompts[2][1]
    truth = decode(verifier, ids, None, N).tokens
    result = decode(verifier, ids, scripted(truth, block=5, wrong_from=2), N)
    assert result.tokens == truth
    assert all(r.accepted == min(2, r.proposed) for r in result.rounds)
    assert result.metrics["block_acceptance"] < 1.0
    pos = result.metrics["per_position"]
    drafted = [r.proposed for r in result.rounds if r.proposed]
    assert pos["accepted"] == [len(drafted), sum(p >= 2 for p in drafted), 0, 0, 0]
    assert pos["rate"][:2] == [1.0, 1.0] and pos["rate"][2:] == [0.0] * 3
    assert pos["conditional"][2] == 0.0 and pos["conditional"][3:] == [None, None]  # never reached


def test_eos_inside_an_accepted_block_stops_where_ar_stops(scripted, verifier, prompts, eos):
    ids = prompts[0][1]
    reply = decode(verifier, ids, None, 256, eos).tokens  # replies run ~75-170 tokens
    assert reply[-1] in eos
    ids, truth = ids + reply[:-10], reply[-10:]  # greedy resumes its own reply: 10 tokens to EOS
    junk = [5] * 16  # one block holds the whole reply and runs past its EOS
    result = decode(verifier, ids, scripted(truth + junk, block=len(truth) + 4), 32, eos)
    assert result.tokens == truth
    last = result.rounds[-1]
    assert last.emitted < last.accepted + 1 or last.accepted < last.proposed


@pytest.mark.parametrize("budget", [0, 1, 2, 7])
def test_max_new_tokens_is_exact(scripted, verifier, peft_verifier, tokenizer, prompts, budget):
    ids = prompts[0][1]
    truth = decode(verifier, ids, None, budget).tokens
    assert len(truth) == budget
    for drafter in (scripted(truth + [5] * 8, block=4),
                    PeftBDDrafter(peft_verifier, tokenizer.mask_token_id, 8)):
        assert decode(peft_verifier, ids, drafter, budget).tokens == truth


def test_decoder_reuses_across_requests(verifier, prompts, eos, ar_outputs):
    decoder = SpeculativeDecoder(verifier, None, eos, 32)
    assert [decoder.decode(ids).tokens for _, ids in prompts] == [ar_outputs[p] for p, _ in prompts]


def test_verifier_steps_count_batched_prefills_and_verifies(verifier, prompts, eos):
    """One step per batched forward, as a scheduler counts them: at batch 1 a request's prefill
    and its rounds; with every request at once, one prefill and the longest request's rounds."""
    ids = [p for _, p in prompts]
    one = SpeculativeDecoder(verifier, None, eos, 12)
    results = [one.decode(p) for p in ids]
    assert one.verifier_steps == sum(1 + len(r.rounds) for r in results)
    together = SpeculativeDecoder(verifier, None, eos, 12)
    batched = together.decode_many(ids, len(ids))
    assert together.verifier_steps == 1 + max(len(r.rounds) for r in batched)


def _stop_token_inside(truth: list[int], at: int) -> int:
    """A token of `truth` first seen at index `at` or later (taken as the request's EOS)."""
    for i in range(at, len(truth)):
        if truth[i] not in truth[:i]:
            return i
    raise AssertionError("no token first seen late enough")


def test_draft_tokens_past_eos_are_not_accepted(scripted, verifier, prompts):
    """A draft that matches the verifier past the EOS that ends the output: the output stops at
    the EOS (as AR's does) and so do the counts (accepted, per position, tokens per round)."""
    ids = prompts[0][1]
    truth = decode(verifier, ids, None, N).tokens  # no EOS: the verifier's greedy run goes on
    stop = _stop_token_inside(truth, 4)
    ar = decode(verifier, ids, None, N, eos_ids=[truth[stop]])
    assert ar.tokens == truth[: stop + 1]
    result = decode(verifier, ids, scripted(truth, block=N - 2), N, eos_ids=[truth[stop]])
    assert result.tokens == ar.tokens  # unchanged output
    (only,) = result.rounds  # prefill commits truth[0]; one round drafts truth[1:N-1], all match
    assert (only.proposed, only.accepted, only.emitted) == (N - 2, stop, stop)
    assert only.ended_in_draft
    m = result.metrics
    assert m["mean_accepted"] == m["mean_accepted_prefix"] == stop
    assert m["token_acceptance"] == stop / (N - 2) and m["block_acceptance"] == 0.0
    pos = m["per_position"]
    assert pos["accepted"] == [1] * stop + [0] * (N - 2 - stop)
    assert pos["reached"] == [1] * stop + [0] * (N - 2 - stop)  # never judged past the EOS
    assert pos["conditional"] == [1.0] * stop + [None] * (N - 2 - stop)
    assert sum(pos["accepted"]) == only.accepted == len(result.tokens) - 1  # all but prefill's


def test_draft_tokens_past_the_budget_are_not_accepted(scripted, verifier, prompts):
    """A draft longer than the budget allows (a split server may send one): only the tokens the
    budget keeps count as accepted."""
    ids = prompts[1][1]
    truth = decode(verifier, ids, None, N).tokens
    decoder = SpeculativeDecoder(verifier, None, (), max_new_tokens=4)
    state = decoder.start(ids)
    result = decoder.verify(state, truth[1:9])  # 8 correct tokens, 3 left in the budget
    assert result.tokens == truth[1:4] and state.new_tokens == truth[:4] and result.done
    assert (result.proposed, result.accepted) == (8, 3)


def test_eos_as_the_bonus_still_counts_the_whole_draft(scripted, verifier, prompts):
    ids = prompts[2][1]
    truth = decode(verifier, ids, None, N).tokens
    stop = _stop_token_inside(truth, 5)
    result = decode(verifier, ids, scripted(truth, block=stop - 1), N, eos_ids=[truth[stop]])
    assert result.tokens == truth[: stop + 1]
    (only,) = result.rounds  # drafts truth[1:stop], the verifier's bonus is the EOS
    assert (only.proposed, only.accepted, only.emitted) == (stop - 1, stop - 1, stop)
    assert not only.ended_in_draft
