"""Early-exit PEFT-BD: LoRA only in the first k layers, drafts equal to a backbone physically cut
to k layers, the verifier cache's deeper layers untouched, and speculative output equal to AR."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from peftbd.decoding import PeftBDDrafter, decode
from peftbd.decoding.verify import prefill
from peftbd.models.early_exit import adapter_depth
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier
from peftbd.models.peft_bd import (
    adapter_on,
    attach_drafter_adapter,
    draft_attention_mask,
    draft_input_ids,
    draft_position_ids,
    load_drafter_adapter,
)

K, D = 1, 8
PROMPTS = [[5, 17, 300, 21, 42, 99, 64, 7, 12], [40, 41, 900, 3, 77]]


@pytest.fixture(scope="module")
def mask_id(tiny_cfg) -> int:
    return load_tokenizer(tiny_cfg).mask_token_id


@pytest.fixture(scope="module")
def drafter(perturbed_drafter):
    return perturbed_drafter(draft_layers=K, seed=0)


def test_lora_lives_only_in_the_first_k_layers_and_the_depth_survives_saving(
        tiny_cfg, drafter, mask_id, tmp_path):
    layers = {int(n.split(".layers.")[1].split(".")[0])
              for n, p in drafter.named_parameters() if p.requires_grad and ".layers." in n}
    assert layers == set(range(K))
    assert adapter_depth(drafter) == K
    whole = attach_drafter_adapter(load_verifier(tiny_cfg), tiny_cfg.peftbd, mask_id)
    assert adapter_depth(whole) == whole.get_base_model().config.num_hidden_layers == 2
    drafter.save_pretrained(tmp_path / "adapter")
    assert adapter_depth(load_drafter_adapter(load_verifier(tiny_cfg), tmp_path)) == K


def test_draft_layers_beyond_the_backbone_is_rejected(tiny_cfg, mask_id):
    with pytest.raises(ValueError, match=r"peftbd.draft_layers=3: the verifier has 2 layers"):
        attach_drafter_adapter(load_verifier(tiny_cfg),
                               dataclasses.replace(tiny_cfg.peftbd, draft_layers=3), mask_id)


@torch.no_grad()
def test_early_exit_draft_equals_a_backbone_cut_to_k_layers(drafter, mask_id):
    state = prefill(drafter, PROMPTS[0], max_new_tokens=32, eos_ids=())
    before = [(k.clone(), v.clone()) for k, v in state.cache.committed()]
    proposal = PeftBDDrafter(drafter, mask_id, D).propose([state], [D])[0][0]

    cut = copy.deepcopy(drafter)  # the reference: the first K layers, physically
    cut.get_base_model().model.layers = nn.ModuleList(cut.get_base_model().model.layers[:K])
    cut.get_base_model().config.num_hidden_layers = K
    n = len(state.tokens) - 1
    with adapter_on(cut):
        out = cut.get_base_model()(
            input_ids=draft_input_ids(state.tokens[-1], mask_id, D),
            position_ids=draft_position_ids(n, D),
            attention_mask=draft_attention_mask(n, D, False, torch.float32),
            past_key_values=None if n == 0 else _cache_prefix(state, K),
        )
    logits = out.logits[0, 1:].clone()
    logits[:, mask_id] = -torch.inf
    assert proposal.tolist() == logits.argmax(-1).tolist()
    after = state.cache.committed()
    for (k0, v0), (k1, v1) in zip(before, after, strict=True):  # every layer back as it was
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def _cache_prefix(state, k: int):
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (keys, values) in enumerate(state.cache.committed()[:k]):
        cache.update(keys.clone(), values.clone(), i)
    return cache


@torch.no_grad()
def test_speculative_decoding_with_an_early_exit_drafter_equals_ar(tiny_cfg, drafter, mask_id):
    eos = eos_token_ids(drafter.get_base_model(), load_tokenizer(tiny_cfg))
    spec = PeftBDDrafter(drafter, mask_id, D)
    drafts = 0
    # with and without EOS: where the verifier stops depends on the world's weights, which
    # differ between machine kinds; without EOS every decode runs all 40 tokens
    for prompt in PROMPTS:
        for stop in (eos, []):
            ar = decode(drafter, prompt, max_new_tokens=40, eos_ids=stop)
            out = decode(drafter, prompt, drafter=spec, max_new_tokens=40, eos_ids=stop)
            assert out.tokens == ar.tokens
            drafts += out.forward_calls.get("draft", 0)
    assert drafts >= 40  # many early-exit drafts and cache crops (90 on the 2-core AVX2 box)
