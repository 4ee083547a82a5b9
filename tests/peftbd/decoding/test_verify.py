"""The verify-and-accept step: cache exactness after partial acceptance, split draft/verify."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from peftbd.decoding import MTPDrafter, PeftBDDrafter, SpeculativeDecoder, advance, decode, prefill, verify
from peftbd.decoding.state import all_feature_layers, with_feature_layers
from peftbd.decoding.verify import accepted_prefix
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import attach_drafter_adapter


@torch.inference_mode()
def test_cache_after_partial_acceptance_equals_a_fresh_forward(verifier, prompts):
    ids = prompts[0][1]
    truth = decode(verifier, ids, None, 12).tokens
    state = prefill(verifier, ids, 12)
    wrong = (truth[4] + 1) % verifier.config.vocab_size
    result = verify(verifier, state, truth[1:4] + [wrong, 7, 9])
    assert (result.proposed, result.accepted, result.tokens) == (6, 3, truth[1:5])
    assert state.tokens == ids + truth[:5]
    assert state.cache.get_seq_length() == len(state.tokens) - 1
    fresh = verifier.model(input_ids=torch.tensor([state.tokens]))
    torch.testing.assert_close(state.hidden, fresh.last_hidden_state[:, -5:-1], atol=1e-4, rtol=1e-4)
    reference = DynamicCache()
    verifier.model(input_ids=torch.tensor([state.tokens[:-1]]), cache=reference)
    for (keys, values), want in zip(state.cache.committed(), reference.layers, strict=True):
        torch.testing.assert_close(keys, want.keys, atol=1e-4, rtol=1e-4)  # the fresh forward's KV
        torch.testing.assert_close(values, want.values, atol=1e-4, rtol=1e-4)


def test_accepted_prefix():
    assert accepted_prefix([1, 2, 3], [1, 2, 4, 9]) == 2
    assert accepted_prefix([], [5]) == 0
    assert accepted_prefix([1, 2], [1, 2, 7]) == 2


@pytest.fixture(scope="module")
def drafters(tiny_cfg, tokenizer):
    """(verifier with an untrained adapter, PEFT-BD drafter, FastMTP drafter on that verifier)."""
    from peftbd.models.loading import load_verifier

    torch.manual_seed(0)
    model = attach_drafter_adapter(load_verifier(tiny_cfg), tiny_cfg.peftbd, tokenizer.mask_token_id)
    return model, [PeftBDDrafter(model, tokenizer.mask_token_id, 6),
                   MTPDrafter(MTPHead(model), model, num_steps=3)]


def test_split_draft_and_verify_pass_plain_token_lists(drafters, verifier, prompts, eos):
    """Drafter and verifier hold separate states (as in two processes) and exchange lists."""
    model, split_drafters = drafters
    ids = prompts[1][1]
    truth = decode(verifier, ids, None, 32, eos).tokens
    for drafter in split_drafters:
        drafting, verifying = SpeculativeDecoder(model, drafter, eos, 32), SpeculativeDecoder(verifier, None, eos, 32)
        d_state, v_state = drafting.start(ids), verifying.start(ids)
        while not v_state.done:
            draft: list[int] = drafting.propose(d_state)[0].tolist()
            committed = verifying.verify(v_state, draft).tokens
            advance(model, d_state, committed)
            assert d_state.cache.get_seq_length() == len(d_state.tokens) - 1
        assert v_state.new_tokens == truth and d_state.tokens == v_state.tokens and d_state.done


def test_bad_calls_name_the_problem(drafters, verifier, prompts):
    model, (_, mtp) = drafters
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        prefill(verifier, [], 4)
    done = prefill(verifier, prompts[0][1], 1)
    with pytest.raises(ValueError, match="finished request"):
        verify(verifier, done, [1])
    decoder = SpeculativeDecoder(model, mtp, (), 8)
    state = decoder.start(prompts[0][1])
    with pytest.raises(ValueError, match="no new_tokens"):
        advance(model, state, [])
    decoder.propose(state)
    with pytest.raises(RuntimeError, match="once per verify"):
        decoder.propose(state)


def test_one_prefill_keeping_every_layer_starts_any_drafter_as_its_own_would(verifier, prompts):
    """`with_feature_layers`: a prefill keeping every layer's features, cut to some layers (in
    any order), is the prefill that kept just those: the same tokens, hidden states and
    features; a layer the state does not keep is refused by name."""
    ids = prompts[0][1]
    everything = prefill(verifier, ids, 8, feature_layers=all_feature_layers(
        verifier.config.num_hidden_layers))
    for layers in [(), (2,), (2, 0), (0, 1, 2)]:
        own, cut = prefill(verifier, ids, 8, feature_layers=layers), with_feature_layers(everything, layers)
        assert cut.tokens == own.tokens and cut.feature_layers == own.feature_layers == layers
        torch.testing.assert_close(cut.hidden, own.hidden, rtol=0, atol=0)
        if layers:
            torch.testing.assert_close(cut.features, own.features, rtol=0, atol=0)
        else:
            assert cut.features is own.features is None
    with pytest.raises(ValueError, match=r"not of \[1\]"):
        with_feature_layers(with_feature_layers(everything, (0, 2)), (1,))
