"""Drafting ahead: PEFT-BD's pre-draft forward is the ordinary draft's layout with the guessed
tokens in its chunk, batch-invariant, leaves the cache alone; controlled acceptance scripts the
guess and keeps the round's own draws; the guessed outcome is the request's likeliest."""

from __future__ import annotations

import copy

import pytest
import torch

from peftbd.decoding import PeftBDDrafter, SpeculativeDecoder
from peftbd.decoding.ahead import ahead_pattern, drafts_ahead, likeliest
from peftbd.decoding.controlled import AcceptanceProfile, ControlledDrafter, reference_oracle
from peftbd.models.peft_bd import attach_drafter_adapter

D = 8
BUDGET = 48


@pytest.fixture(scope="module")
def setup(tiny_cfg, tokenizer, eos):
    from peftbd.models.loading import load_verifier

    torch.manual_seed(0)
    model = attach_drafter_adapter(load_verifier(tiny_cfg), tiny_cfg.peftbd, tokenizer.mask_token_id)
    with torch.no_grad():  # a drafter whose adapter changes the forward (LoRA B starts at 0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return model, PeftBDDrafter(model, tokenizer.mask_token_id, D)


def test_the_guess_is_the_most_frequent_outcome_so_far():
    assert likeliest([], 8) == 0
    assert likeliest([2, 0, 2, 1], 8) == 2
    assert likeliest([3, 1, 1, 3], 8) == 1  # a tie: the shorter
    assert likeliest([5, 5, 1], 4) == 4  # never more than the draft proposes


def test_the_pattern_reads_known_tokens_causally_and_masks_as_a_draft():
    p = ahead_pattern(3, 4, anchored=False, device=torch.device("cpu"))
    assert p.shape == (7, 7)
    assert p[:2, :2].tolist() == [[True, False], [True, True]] and not p[:2, 2:].any()
    assert p[2, :3].all() and not p[2, 3:].any()  # the anchor (b) is causal: no masks
    assert p[3:].all()  # masks see every known token and each other
    assert ahead_pattern(3, 4, anchored=True, device=torch.device("cpu"))[2].all()


def test_guessing_nothing_accepted_is_the_ordinary_draft_one_step_on(setup, prompts, eos):
    """With no token guessed the chunk is the ordinary draft's, [t, masks]: the masks after the
    bonus's are exactly the ordinary draft's later tokens (a block draft predicts them in
    parallel, not knowing the tokens before them either)."""
    model, drafter = setup
    dec = SpeculativeDecoder(model, drafter, eos, BUDGET)
    state = dec.start(prompts[0][1])
    ordinary = dec.propose(state)[0].tolist()
    pre = drafter.propose_ahead([state], [ordinary], [0], [BUDGET])[0]
    assert pre.accepted == 0 and pre.draft[0].tolist() == ordinary[1:]


def test_pre_drafts_are_batch_invariant_and_leave_the_cache_alone(setup, prompts, eos):
    model, drafter = setup
    dec = SpeculativeDecoder(model, drafter, eos, BUDGET)
    states = dec.start_many([ids for _, ids in prompts[:3]])
    drafts = [dec.propose(s)[0].tolist() for s in states]
    before = [copy.deepcopy(s.cache.committed()) for s in states]
    guesses, room = [0, 2, 2], [BUDGET, BUDGET, 3]
    together = drafter.propose_ahead(states, drafts, guesses, room)
    alone = [drafter.propose_ahead([s], [d], [k], [m])[0]
             for s, d, k, m in zip(states, drafts, guesses, room)]
    for a, b in zip(together, alone):
        assert (a.accepted, a.draft.tolist()) == (b.accepted, b.draft.tolist())
    assert together[2].draft.shape[-1] == 3 and together[0].draft.shape[-1] == D - 1
    for s, kv in zip(states, before):
        assert all(torch.equal(k, k2) and torch.equal(v, v2)
                   for (k, v), (k2, v2) in zip(s.cache.committed(), kv))
    assert drafts_ahead(drafter)


def test_a_controlled_pre_draft_accepts_what_its_round_draws(setup, prompts, eos):
    """When the guessed length holds, verifying the pre-draft accepts what the ordinary round
    would have (the same draws, its one position shorter), and the output stays AR's."""
    model, inner = setup
    prompt = prompts[1][1]
    ar = SpeculativeDecoder(model, None, eos, BUDGET).decode(prompt).tokens
    controlled = ControlledDrafter(inner, AcceptanceProfile.with_mean(2.5, D),
                                   reference_oracle({tuple(prompt): ar}), 0)
    dec = SpeculativeDecoder(model, controlled, eos, BUDGET)
    state, checked = dec.start(prompt), 0
    while not state.done:
        draft = dec.propose(state)[0].tolist()
        k = dec.verify(copy.deepcopy(state), draft).accepted  # the outcome, guessed right
        pre = controlled.propose_ahead([state], [draft], [k], [state.remaining - k - 2])[0]
        dec.verify(state, draft)
        if state.done:
            break
        theirs = dec.propose(copy.deepcopy(state))[0].tolist()
        mine = dec.verify(copy.deepcopy(state), pre.draft).accepted
        assert mine == min(dec.verify(copy.deepcopy(state), theirs).accepted, pre.draft.shape[-1])
        checked += 1
    assert checked >= 3 and state.new_tokens == ar
