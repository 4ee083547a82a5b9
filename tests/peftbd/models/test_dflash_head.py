"""The head's DFlash recipe switches (`HeadConfig.feature_rule`, `block_masks`): DFlash's feature
layers, its block of D positions drafting D - 1 tokens (exact under greedy verification), and
that today's `head` section is untouched by them."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
import torch
from transformers import Qwen3Config

from peftbd.config import load_config
from peftbd.data.chat import encode_prompt, prompt_messages
from peftbd.decoding import BDHeadDrafter, SpeculativeDecoder
from peftbd.models.bd_head import BDHead, HeadShape, dflash_target_layers, drafted, feature_layers
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier

QWEN3_06B = Qwen3Config(num_hidden_layers=28)


def _rule(layers: int, rule: str = "per_layer"):
    return dataclasses.replace(load_config("tiny").peftbd_head, layers=layers, feature_layers=(),
                               feature_rule=rule)


def test_dflash_target_layers_are_dflash_spacing():
    assert dflash_target_layers(28, 5) == [1, 7, 13, 19, 25]  # Qwen3-0.6B, 5 draft layers
    assert dflash_target_layers(28, 1) == [14]  # one layer: the middle one
    assert dflash_target_layers(28, 2) == [1, 25]
    assert dflash_target_layers(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-4B/8B's depth
    # shallow verifiers (DFlash needs 4 layers): spread over all but the last (never read by
    # DFlash; transformers and vLLM disagree on its norm), distinct
    assert dflash_target_layers(2, 1) == dflash_target_layers(2, 5) == [0]
    assert dflash_target_layers(3, 1) == [0]
    assert dflash_target_layers(3, 2) == dflash_target_layers(3, 5) == [0, 1]


def test_per_layer_reads_the_output_of_each_target_layer():
    """DFlash reads hidden_states[id + 1] (the output of decoder layer id)."""
    assert feature_layers(_rule(5), QWEN3_06B) == [2, 8, 14, 20, 26]
    assert feature_layers(_rule(1), QWEN3_06B) == [15]
    tiny = Qwen3Config(num_hidden_layers=2)
    assert feature_layers(_rule(1), tiny) == feature_layers(_rule(5), tiny) == [1]
    explicit = dataclasses.replace(_rule(5), feature_layers=(0, 3))
    assert feature_layers(explicit, QWEN3_06B) == [0, 3]  # explicit layers win over the rule


def test_three_is_todays_spread():
    assert feature_layers(_rule(5, "three"), QWEN3_06B) == [1, 14, 28]
    assert feature_layers(_rule(1, "three"), Qwen3Config(num_hidden_layers=2)) == [1, 2]


def test_a_block_minus_one_head_drafts_one_token_less():
    assert (drafted("block", 16), drafted("block_minus_one", 16)) == (16, 15)
    with pytest.raises(ValueError, match="block_size >= 2"):
        drafted("block_minus_one", 1)


def test_the_shape_saves_its_block_and_old_heads_draft_whole_blocks(tmp_path):
    cfg = load_config("tiny")
    verifier = load_verifier(cfg)
    torch.manual_seed(0)
    head = BDHead(verifier, HeadShape.of(cfg.dflash, verifier.config, 5))
    assert head.shape.block_masks == "block_minus_one" and head.shape.drafted(16) == 15
    head.save_pretrained(tmp_path)
    assert BDHead.from_pretrained(tmp_path, verifier).shape == head.shape
    meta = json.loads((tmp_path / "bd_head.json").read_text())
    del meta["block_masks"]  # a head saved before the field existed
    assert HeadShape.saved(meta).block_masks == "block"


@pytest.fixture(scope="module")
def decoding(tiny_world):
    cfg = load_config("tiny")
    verifier, tokenizer = load_verifier(cfg), load_tokenizer(cfg)
    with open(tiny_world.corpus_path) as f:
        rows = [json.loads(line) for line in itertools.islice(f, 3)]
    prompts = [encode_prompt(tokenizer, prompt_messages(r["messages"])) for r in rows]
    return cfg, verifier, tokenizer.mask_token_id, eos_token_ids(verifier, tokenizer), prompts


@pytest.mark.parametrize("block_masks, proposed", [("block", 8), ("block_minus_one", 7)])
def test_the_drafter_drafts_its_block_and_stays_exact(decoding, block_masks, proposed):
    """An untrained head with random weights (its drafts miss) still decodes greedy AR's output,
    proposing `drafted` tokens a round (fewer only where the budget ends)."""
    cfg, verifier, mask, eos, prompts = decoding
    section = dataclasses.replace(cfg.dflash, block_masks=block_masks)
    torch.manual_seed(0)
    head = BDHead(verifier, HeadShape.of(section, verifier.config, mask))
    drafter = BDHeadDrafter(head, verifier, 8)
    assert drafter.block_size == proposed
    ar = SpeculativeDecoder(verifier, None, eos, 40)
    spec = SpeculativeDecoder(verifier, drafter, eos, 40)
    for prompt in prompts:
        result = spec.decode(prompt)
        assert result.tokens == ar.decode(prompt).tokens
        assert max(r.proposed for r in result.rounds) == proposed
