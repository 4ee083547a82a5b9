"""The per-step memory estimate: the qwen3-0.6b preset's step fits the 24 GB A10G that
cluster.yaml provisions, with headroom, for both objectives; the old layout (one forward of all
64 sequences, every logit at once) did not."""

from __future__ import annotations

import pytest
from transformers import Qwen3Config

from peftbd.config import load_config
from peftbd.manifest import WorkerPeaks
from peftbd.training.deepspeed_config import batch_plan
from peftbd.training.memory import ModelShape, peaks_over_ranks, step_memory

A10G_MIB = 24 * 1024 * 0.95  # 22.8 GiB of the card's 24 GiB are usable
QWEN3_06B = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                        head_dim=128, tie_word_embeddings=True)
COUNTS = {"adapter": (10_093_568, 606_143_488), "mtp": (17_830_144, 613_880_064)}  # tested elsewhere


def _estimate(kind, overrides=()):
    cfg = load_config("qwen3-0.6b", overrides=list(overrides))
    optim = cfg.peftbd.optim if kind == "adapter" else cfg.fastmtp.optim
    plan = batch_plan(cfg.training, optim, cfg.training.num_workers)
    return step_memory(kind, cfg, QWEN3_06B, *COUNTS[kind], plan, "bfloat16")


@pytest.mark.parametrize("kind", ["adapter", "mtp"])
def test_the_presets_step_fits_a_24gb_gpu_with_headroom(kind):
    est = _estimate(kind)
    assert est.micro_batch == 8 and est.sequence_tokens == 768 and est.logits_rows == 512
    assert est.total_mib < 0.6 * A10G_MIB, est  # >= 40% headroom for the CUDA context, fragmentation
    assert est.logits_mib < 2048  # one chunk of 512 positions x 151,936 logits


@pytest.mark.parametrize("kind", ["adapter", "mtp"])
def test_the_old_layout_did_not_fit(kind):
    est = _estimate(kind, ["training.micro_batch_size=0", "training.logits_chunk_rows=0"])
    assert est.micro_batch == 64 and est.total_mib > A10G_MIB


def test_unchunked_fastmtp_logits_are_the_issues_30_gb():
    """64 x 767 positions x 151,936 fp32 logits = 29.8 GB for one step of one MTP step."""
    est = _estimate("mtp", ["training.micro_batch_size=0", "training.logits_chunk_rows=0",
                            "fastmtp.num_steps=1", "fastmtp.loss_weights=[1.0]", "data.max_new_tokens=767",
                            "data.max_prompt_len=1"])
    assert est.logits_rows == 64 * 767
    one_copy_gb = 64 * 767 * 151936 * 4 / 1e9
    assert one_copy_gb == pytest.approx(29.8, abs=0.05)
    assert est.logits_mib * 2**20 > 2 * one_copy_gb * 1e9  # the logits and their log-softmax


def test_shape_and_per_token_activations():
    shape = ModelShape.of(QWEN3_06B)
    assert (shape.q_dim, shape.kv_dim, shape.layers) == (2048, 1024, 28)
    assert shape.activation_bytes_per_token(2, 16) == 82_144  # ~80 KB per token and layer in bf16


def test_peaks_over_ranks_without_a_process_group_are_this_ranks():
    here = WorkerPeaks(1, 100.0, None, "float32")
    assert peaks_over_ranks(here, device=None) == here
