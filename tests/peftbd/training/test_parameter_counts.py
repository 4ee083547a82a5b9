"""Trainable/total parameters on Qwen3-0.6B's architecture (meta device, no weights) against the
paper: PEFT-BD 10.1M of 605.9M (1.666%), FastMTP 17.8M of 613.9M (2.905%); and the
block-diffusion head's share of the backbone."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from peftbd.config import load_config
from peftbd.models.bd_head import BDHead, HeadShape
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import attach_drafter_adapter, count_parameters
from peftbd.training.distill_task import head_parameter_counts, parameter_summary

QWEN3_MASK_ID = 151669  # <|mask|>, added by load_tokenizer below the 151936 embedding rows


@pytest.fixture
def qwen3_06b_meta() -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
        max_position_embeddings=40960,
    )
    with torch.device("meta"):
        return Qwen3ForCausalLM(config)


def _within(value: float, paper: float, rel: float = 0.01) -> bool:
    return abs(value - paper) <= rel * paper


def test_peftbd_counts_match_the_paper(qwen3_06b_meta):
    cfg = load_config("qwen3-0.6b")
    model = attach_drafter_adapter(qwen3_06b_meta, cfg.peftbd, QWEN3_MASK_ID)
    summary = parameter_summary(*count_parameters(model))
    # LoRA r=16 on q,k,v,o,gate,up,down of 28 layers: 28 * 16 * (3072+2048+2048+3072+4*4096) = 10,092,544
    # plus the mask-token row (1024).
    assert summary["trainable"] == 10_092_544 + 1024
    assert _within(summary["trainable"], 10.1e6)
    assert _within(summary["total"], 605.9e6)
    assert _within(summary["trainable_percent"], 1.666)


def test_fastmtp_counts_match_the_paper(qwen3_06b_meta):
    head = MTPHead(qwen3_06b_meta)
    summary = parameter_summary(*head_parameter_counts(head, qwen3_06b_meta))
    assert _within(summary["trainable"], 17.8e6)
    assert _within(summary["total"], 613.9e6)
    assert _within(summary["trainable_percent"], 2.905)


def test_block_diffusion_head_is_within_five_percent_of_the_backbone(qwen3_06b_meta):
    """The qwen3-0.6b preset's head (1 decoder layer, 3 feature layers): 15.7M of the layer, 3.1M
    of the 3 x 1024 -> 1024 feature projection, 2.1M of the anchor fusion, 3 norms and the mask
    embedding; the verifier's embeddings and LM head are shared, not counted."""
    cfg = load_config("qwen3-0.6b")
    head = BDHead(qwen3_06b_meta, HeadShape.of(cfg.peftbd_head, qwen3_06b_meta.config, QWEN3_MASK_ID))
    summary = parameter_summary(*head_parameter_counts(head, qwen3_06b_meta))
    layer = 2 * 1024 * 2048 + 2 * 1024 * 1024 + 3 * 1024 * 3072 + 2 * 1024 + 2 * 128  # attn, MLP, norms
    fuse = 2 * 1024 * 1024  # the anchor token fused with its predecessor's context
    assert summary["trainable"] == layer + 3 * 1024 * 1024 + fuse + 4 * 1024
    backbone = count_parameters(qwen3_06b_meta)[1]
    assert summary["trainable"] == 20_977_920  # 3.5% of the 596.0M backbone
    assert summary["trainable"] / backbone <= 0.05  # issue 16: <= 5% of the backbone
