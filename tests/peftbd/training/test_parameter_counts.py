"""Trainable/total parameters on Qwen3-0.6B's architecture (meta device, no weights) against the
paper: PEFT-BD 10.1M of 605.9M (1.666%), FastMTP 17.8M of 613.9M (2.905%)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from peftbd.config import load_config
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import attach_drafter_adapter, count_parameters
from peftbd.training.tasks import head_parameter_counts, parameter_summary

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
    model = attach_drafter_adapter(qwen3_06b_meta, cfg.drafter, QWEN3_MASK_ID)
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
