"""The GPU cost model (`peftbd.simulation.roofline_cost`): its analytic counts against
`ForwardCounter` on the engine's own prefill, verify and draft forwards of a small random Qwen3,
and the roofline's shape at Qwen3-0.6B / Qwen3-8B."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from peftbd.benchmarking.forward_counter import ForwardCount, ForwardCounter
from peftbd.benchmarking.roofline import GPUS, forward_seconds
from peftbd.config import load_config
from peftbd.decoding.bd_head_drafter import BDHeadDrafter
from peftbd.decoding.mtp_drafter import MTPDrafter
from peftbd.decoding.peft_bd_drafter import PeftBDDrafter
from peftbd.decoding.ragged import RaggedKV
from peftbd.decoding.verify import new_state, prefill_rows, prefill_step, verify_rows
from peftbd.models.bd_head import BDHead, HeadShape
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import attach_drafter_adapter
from peftbd.simulation.roofline_cost import (
    DEFAULT_OVERHEAD_MS,
    METHODS,
    OVERHEAD_KV_TOKENS,
    PAPER_AR_TOKENS_PER_S,
    PAPER_GPU,
    ROOFLINE_MODELS,
    Decoder,
    DraftSizes,
    HeadSize,
    RooflineCost,
    backbone,
    draft_counts,
    forward_counts,
)
from peftbd.simulation.shapes import ForwardShape

FLOPS_TOL, READ_TOL = 1e-6, 0.005
"""Relative agreement with the counter: FLOPs agree exactly (measured); reads within 0.25%
(measured), off by the small tensors a forward is handed (ids, positions, lengths, rotary
frequencies), which the analytic count leaves out."""
MASK_ID, PROMPT, ROWS = 511, 20, 2


def _small(tied: bool) -> tuple[torch.nn.Module, Decoder]:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         tie_word_embeddings=tied, max_position_embeddings=256)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.eval().requires_grad_(False), Decoder.of(config, "small")


def _pool(pool: RaggedKV) -> int:
    """Elements of a static KV pool: the counter reads a pool's whole storage, the analytic count
    the committed KV only."""
    return sum(t.numel() for t in (*pool.keys, *pool.values))


def _agrees(counted: ForwardCount, analytic: ForwardCount, kv: int, pool: int) -> None:
    """`counted` = `analytic` with its `kv` committed KV elements replaced by a `pool`'s storage."""
    reads = analytic.elements_read - kv + pool
    assert counted.flops == pytest.approx(analytic.flops, rel=FLOPS_TOL)
    assert counted.elements_read == pytest.approx(reads, rel=READ_TOL)


def _prompts(rows: int = ROWS) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, MASK_ID, (PROMPT,), generator=gen).tolist() for _ in range(rows)]


@pytest.mark.parametrize("tied", [True, False])
def test_prefill_and_verify_counts_match_the_engines_forwards(tied: bool) -> None:
    model, arch = _small(tied)
    with torch.inference_mode():
        state = new_state(model, _prompts(1)[0], 8)
        counter = ForwardCounter()
        state.forwards.observer = counter.forward
        prefill_step(model, [state], chunk=64)  # a fresh pool: its buffers are made inside the forward
        prefill = forward_counts(ForwardShape("prefill", "ar", 1, PROMPT, 0), arch)[0]
        _agrees(counter.forwards[0], prefill, 0, 0)

        states = prefill_rows(model, _prompts(), [8] * ROWS)
        kv_tokens, pool = sum(s.cache.get_seq_length() for s in states), _pool(states[0].cache.kv)
        counter = ForwardCounter()
        states[0].forwards.observer = counter.forward
        verify_rows(model, states, [[1, 2, 3]] * ROWS)
    verify = forward_counts(ForwardShape("verify", "peftbd", ROWS, 4, kv_tokens), arch)[0]
    assert kv_tokens == ROWS * PROMPT and [f.mode for f in counter.forwards] == ["verify"]
    _agrees(counter.forwards[0], verify, kv_tokens * arch.kv_per_token(), pool)


def test_peftbd_draft_count_matches_the_drafters_forward() -> None:
    model, arch = _small(True)
    drafter_cfg = dataclasses.replace(load_config("tiny").peftbd, lora_r=4, draft_layers=0)
    peft = attach_drafter_adapter(model, drafter_cfg, MASK_ID).eval()
    assert len(drafter_cfg.target_modules) == 7
    drafter = PeftBDDrafter(peft, MASK_ID, block_size=8)
    with torch.inference_mode():
        states = prefill_rows(peft, _prompts(), [32] * ROWS)
        kv_tokens, pool = sum(s.cache.get_seq_length() for s in states), _pool(states[0].cache.kv)
        counter = ForwardCounter()
        states[0].forwards.observer = counter.forward
        drafter.propose(states, [8] * ROWS)
    sizes = DraftSizes(block_size=8, lora_rank=4)
    [draft] = draft_counts("peftbd", arch, ROWS, 8, kv_tokens, sizes)
    assert len(counter.forwards) == 1
    _agrees(counter.forwards[0], draft, kv_tokens * arch.kv_per_token(), pool)


def test_fastmtp_draft_counts_match_the_drafters_steps() -> None:
    model, arch = _small(True)
    drafter = MTPDrafter(MTPHead(model), model, num_steps=3)
    with torch.inference_mode():
        states = prefill_rows(model, _prompts(), [32] * ROWS)
        for s in states:
            drafter.start(s)
        counter = ForwardCounter()
        states[0].forwards.observer = counter.forward
        drafter.propose(states, [8] * ROWS)  # the first round: step 1 takes in the whole prompt
    kv_tokens = ROWS * PROMPT
    steps = draft_counts("fastmtp", arch, ROWS, 8, kv_tokens, fresh=PROMPT)
    assert len(steps) == len(counter.forwards) == 3
    head_kv = kv_tokens * arch.kv_per_token(1)
    for i, (counted, analytic) in enumerate(zip(counter.forwards, steps)):
        # step 1 makes the head's pool (nothing of it read); later steps read its whole storage
        _agrees(counted, analytic, head_kv, 0 if i == 0 else _pool(drafter.pool))


def test_block_diffusion_head_draft_count_matches_the_drafters_forward() -> None:
    model, arch = _small(False)
    head = BDHead(model, HeadShape(layers=1, intermediate_size=96, feature_layers=(1, 2), mask_id=MASK_ID))
    drafter = BDHeadDrafter(head, model, block_size=8)
    with torch.inference_mode():
        states = prefill_rows(model, _prompts(), [32] * ROWS, feature_layers=(1, 2))
        for s in states:
            drafter.start(s)
        counter = ForwardCounter()
        states[0].forwards.observer = counter.forward
        drafter.propose(states, [8] * ROWS)
    kv_tokens = ROWS * PROMPT
    sizes = DraftSizes(block_size=8, head=HeadSize(1, 2, intermediate=96))
    [draft] = draft_counts("peftbd_head", arch, ROWS, 8, kv_tokens, sizes, fresh=PROMPT)
    assert len(counter.forwards) == 1  # its pool is made inside this first forward: none of it read
    _agrees(counter.forwards[0], draft, kv_tokens * arch.kv_per_token(1), 0)


def _ms(cost: RooflineCost, shape: ForwardShape) -> float:
    return sum(1e3 * forward_seconds(c, cost.gpu) for c in cost.counts(shape))


def test_verify_cost_grows_with_rows_and_kv() -> None:
    cost = RooflineCost(GPUS["H100"], "qwen3-8b", ROOFLINE_MODELS["qwen3-8b"])
    by_rows = [cost.forward_ms(ForwardShape("verify", "peftbd", r, 4, 512 * r)) for r in (1, 8, 64, 256)]
    by_kv = [cost.forward_ms(ForwardShape("verify", "ar", 8, 1, kv)) for kv in (0, 4096, 65536)]
    assert by_rows == sorted(by_rows) and len(set(by_rows)) == 4
    assert by_kv == sorted(by_kv) and len(set(by_kv)) == 3


def test_qwen3_8b_decode_step_is_memory_bound_at_its_weight_bytes() -> None:
    arch, h100, h200 = ROOFLINE_MODELS["qwen3-8b"], GPUS["H100"], GPUS["H200"]
    [step] = forward_counts(ForwardShape("verify", "ar", 1, 1, 512), arch)
    assert step.bytes_at(2) / h100.hbm_bytes_per_s > 100 * step.flops / h100.bf16_flops_per_s
    d, kv, q = arch.hidden_size, arch.num_key_value_heads * arch.head_dim, 32 * 128
    layer = d * q * 2 + d * kv * 2 + 3 * d * arch.intermediate_size
    weights = 2 * (36 * layer + arch.vocab_size * d)  # bf16; the input table: only its row is read
    assert weights == pytest.approx(15.2e9, rel=0.01)
    assert 1e3 * forward_seconds(step, h100) == pytest.approx(1e3 * weights / 3.35e12, rel=0.01)  # ~4.5 ms
    for method, width in (("ar", 1), ("peftbd", 16), ("fastmtp", 3), ("peftbd_head", 16)):
        for kind in ("verify", "draft"):
            shape = ForwardShape(kind, method, 1, width, 512)
            slow, fast = RooflineCost(h100, "qwen3-8b", arch), RooflineCost(h200, "qwen3-8b", arch)
            assert _ms(fast, shape) <= _ms(slow, shape)
            assert _ms(fast, shape) < _ms(slow, shape) or method == "ar" and kind == "draft"


def test_paper_draft_fact_and_draft_forwards_pay_one_overhead_each() -> None:
    cost = RooflineCost(GPUS["H100"], "qwen3-0.6b", ROOFLINE_MODELS["qwen3-0.6b"])
    verify, peftbd = ForwardShape("verify", "peftbd", 1, 17, 512), ForwardShape("draft", "peftbd", 1, 16, 512)
    assert _ms(cost, peftbd) == pytest.approx(_ms(cost, verify), rel=0.05)  # a draft costs a verify
    mtp = ForwardShape("draft", "fastmtp", 1, 3, 512)
    assert len(cost.counts(mtp)) == 3
    assert cost.forward_ms(mtp) == pytest.approx(_ms(cost, mtp) + 3 * DEFAULT_OVERHEAD_MS)
    assert cost.forward_ms(ForwardShape("draft", "ar", 1, 0, 512)) == 0.0
    assert cost.name == "roofline: H100 bf16, Qwen3-0.6B, + 2.06 ms/forward (paper's SGLang AR step)"
    assert cost.hop_ms(0) == 1.0 and cost.hop_ms(64_000_000) == pytest.approx(3.0)


def test_default_overhead_is_the_papers_ar_step_less_its_roofline() -> None:
    step = backbone(ROOFLINE_MODELS["qwen3-0.6b"], "verify", 1, 1, OVERHEAD_KV_TOKENS, 1)
    roofline_ms = 1e3 * forward_seconds(step, GPUS[PAPER_GPU])
    assert PAPER_AR_TOKENS_PER_S == 431.36 and PAPER_GPU == "H200"
    assert DEFAULT_OVERHEAD_MS == pytest.approx(1000 / 431.36 - roofline_ms, abs=1e-12)
    assert DEFAULT_OVERHEAD_MS == pytest.approx(2.0577, abs=1e-3)
    assert roofline_ms == pytest.approx(0.2606, abs=1e-3)
    cost = RooflineCost(GPUS[PAPER_GPU], "qwen3-0.6b", ROOFLINE_MODELS["qwen3-0.6b"])
    ar_step = ForwardShape("verify", "ar", 1, 1, OVERHEAD_KV_TOKENS)
    assert cost.forward_ms(ar_step) == pytest.approx(1000 / 431.36)  # the paper's step, recovered


def test_unknown_method_names_the_known_ones() -> None:
    cost = RooflineCost(GPUS["H200"], "qwen3-8b", ROOFLINE_MODELS["qwen3-8b"])
    with pytest.raises(ValueError, match="known: ar, peftbd, fastmtp, peftbd_head, dflash, prompt_lookup"):
        cost.forward_ms(ForwardShape("draft", "medusa", 1, 4, 100))
    with pytest.raises(ValueError, match="'medusa'"):
        cost.forward_ms(ForwardShape("verify", "medusa", 1, 4, 100))


def test_priced_methods_are_the_serving_names() -> None:
    from peftbd.methods import serving_names

    assert set(METHODS) == set(serving_names())
