"""The fast path (`peftbd.decoding.fast_path`): every round forward (the verify, with or without
verifier features, every drafter's draft, a catch-up) on static KV decodes exactly the eager
engine's tokens and rounds, at batch 1 and batch > 1, for AR and every drafter family; compile
time is kept apart from steady state.

The static-KV graph runs uncompiled in the quick tests (its masks and in-place writes are the
fast path's logic; inductor only fuses them) and compiled in the slow ones."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from peftbd.decoding import (
    BDHeadDrafter,
    MTPDrafter,
    PeftBDDrafter,
    SpeculativeDecoder,
    advance_rows,
)
from peftbd.config import load_config
from peftbd.decoding.fast_path import EAGER, FastPath, _static_graph, fast_path_on
from peftbd.decoding.graph_audit import audit
from peftbd.models.bd_head import BDHead, HeadShape
from peftbd.models.loading import load_verifier
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import attach_drafter_adapter

BUDGETS = [20, 7, 16, 12]
FAMILIES = ["ar", "peftbd", "peftbd_2step", "peftbd_early_exit", "fastmtp", "peftbd_head", "dflash"]


@pytest.fixture(scope="module")
def model(tiny_cfg, tokenizer):
    """The verifier with an untrained PEFT-BD adapter: every arm's model."""
    torch.manual_seed(0)
    return attach_drafter_adapter(load_verifier(tiny_cfg), tiny_cfg.peftbd, tokenizer.mask_token_id)


@pytest.fixture(scope="module")
def early(tiny_cfg, tokenizer):
    """A verifier whose adapter drafts through its first layer only."""
    torch.manual_seed(0)
    return attach_drafter_adapter(load_verifier(tiny_cfg), dataclasses.replace(
        tiny_cfg.peftbd, draft_layers=1), tokenizer.mask_token_id)


def _arm(name: str, model, early, tiny_cfg, mask: int):
    """(verifier, drafter) of one family (untrained drafters: they still accept some tokens)."""
    if name == "peftbd":
        return model, PeftBDDrafter(model, mask, 8)
    if name == "peftbd_2step":
        return model, PeftBDDrafter(model, mask, 8, denoise_steps=2)
    if name == "peftbd_early_exit":
        return early, PeftBDDrafter(early, mask, 8)
    if name == "fastmtp":
        return model, MTPDrafter(MTPHead(model), model, num_steps=3)
    if name in ("peftbd_head", "dflash"):  # keep verifier features: a verify with features
        head = tiny_cfg.peftbd_head if name == "peftbd_head" else tiny_cfg.dflash
        return model, BDHeadDrafter(BDHead(model, HeadShape.of(head, model.config, mask)), model, 8)
    return model, None


def _rounds(results) -> list:
    return [(r.tokens, [(x.proposed, x.accepted, x.emitted) for x in r.rounds]) for r in results]


def _check(verifier, drafter, prompts, eos, compiled: bool) -> SpeculativeDecoder:
    """Batch 1, then continuous batching (3 -> 1, rows joining late; compiled: 2 -> 1 over the
    first three requests, fewer graphs to compile), each request's eager tokens and rounds."""
    rows = ([ids for _, ids in prompts] + [prompts[0][1][:9]])[: 3 if compiled else None]
    budgets, batch = BUDGETS[: len(rows)], 2 if compiled else 3
    eager = SpeculativeDecoder(verifier, drafter, eos)
    fast = SpeculativeDecoder(verifier, drafter, eos, fast_path=True)
    fast.reserve(batch, max(map(len, rows)) + max(budgets))  # as the benchmark: no pool growth
    if not compiled:
        fast.path._graph = _static_graph
    want = _rounds(eager.decode(p, n) for p, n in zip(rows, budgets))
    assert _rounds(fast.decode(p, n) for p, n in zip(rows, budgets)) == want  # batch 1
    assert _rounds(fast.decode_many(rows, batch, budgets)) == want
    return fast


@pytest.mark.parametrize("name", FAMILIES)
def test_static_kv_forwards_decode_the_eager_output(model, early, tiny_cfg, tokenizer, prompts,
                                                    eos, name):
    verifier, drafter = _arm(name, model, early, tiny_cfg, tokenizer.mask_token_id)
    _check(verifier, drafter, prompts, eos, compiled=False)


def test_a_static_kv_catch_up_matches_the_eager_one(model, tokenizer, prompts, eos):
    """`advance_rows` (a split drafter replica's catch-up) on the fast path: the same cache."""
    drafter = PeftBDDrafter(model, tokenizer.mask_token_id, 8)
    rows = [ids for _, ids in prompts[:3]]
    out = {}
    for compiled in (False, True):
        dec = SpeculativeDecoder(model, drafter, eos, fast_path=compiled)
        if compiled:
            dec.path._graph = _static_graph
        states = dec.start_many(rows, 12)
        advance_rows(model, states, [[5, 6, 7], [8], [9, 10]], drafter)
        out[compiled] = [s.cache.committed()[-1][0] for s in states]
    for eager, fast in zip(out[False], out[True]):
        torch.testing.assert_close(fast, eager)


def test_forward_paths_say_every_forward_is_compiled(model, early, tiny_cfg, tokenizer, eos):
    for name in FAMILIES:
        verifier, drafter = _arm(name, model, early, tiny_cfg, tokenizer.mask_token_id)
        paths = SpeculativeDecoder(verifier, drafter, eos, fast_path=True).forward_paths()
        assert set(paths.values()) == {"compiled"}, name


@pytest.mark.slow  # a few compiles (10-60 s each on 2 cores, less from inductor's cache)
@pytest.mark.parametrize("name", ["peftbd", "fastmtp", "peftbd_head"])  # AR: test_fast_path_timing
def test_the_compiled_fast_path_decodes_the_eager_output(model, early, tiny_cfg, tokenizer,
                                                         prompts, eos, name):
    """... and every graph mutates static inputs only (the KV pool, marked static): CUDA-graph
    trees would replay each, not skip it (`peftbd.decoding.graph_audit`)."""
    verifier, drafter = _arm(name, model, early, tiny_cfg, tokenizer.mask_token_id)
    with audit() as graphs:
        fast = _check(verifier, drafter, prompts, eos, compiled=True)
    assert isinstance(fast.path, FastPath) and fast.path.compiles > 0
    assert graphs.graphs and all(g.mutated for g in graphs.graphs)  # each writes the KV pool
    assert graphs.skipped == []


@pytest.mark.slow
def test_compile_time_is_counted_apart(verifier, prompts, eos):
    fast = SpeculativeDecoder(verifier, None, eos, 6, fast_path=True)
    with audit() as graphs:
        fast.decode(prompts[0][1])
    assert len(graphs.graphs) == 1 and graphs.skipped == []  # AR's step: static KV writes only
    assert fast.path.compiles == 1 and fast.path.compile_s > 0  # the AR step at batch 1
    compile_s = fast.path.compile_s
    fast.decode(prompts[1][1])  # other lengths, the same graph
    assert (fast.path.compiles, fast.path.compile_s) == (1, compile_s)


def test_auto_puts_cuda_alone_on_the_fast_path(verifier):
    assert fast_path_on("auto", torch.device("cuda")) and not fast_path_on("auto", torch.device("cpu"))
    assert fast_path_on(True, torch.device("cpu")) and not fast_path_on(False, torch.device("cuda"))
    assert SpeculativeDecoder(verifier, None, fast_path="auto").path is EAGER  # on this CPU


def test_the_presets_default_to_auto_and_the_switch_takes_true_false_or_auto():
    assert load_config("tiny").decoding.fast_path == "auto"
    assert load_config("qwen3-0.6b").decoding.fast_path == "auto"
    for value, want in (("true", True), ("false", False), ("auto", "auto")):
        assert load_config("tiny", overrides=[f"decoding.fast_path={value}"]).decoding.fast_path == want
    with pytest.raises(ValueError, match="decoding.fast_path"):
        load_config("tiny", overrides=["decoding.fast_path=sometimes"])


def test_few_half_precision_queries_attend_by_grouped_matmuls_equal_to_sdpa():
    """A decode or verify step in bfloat16 attends by two batched matmuls over the KV as it lies
    in the pool (each KV head's query heads stacked), not the CPU's fused SDPA kernel: the same
    attention up to bfloat16 rounding, masked slots included; float32 and many queries keep
    SDPA, exactly."""
    from torch.nn import functional as F

    from peftbd.decoding.fast_path import _FEW_QUERIES, _gqa_sdpa

    class Attention(torch.nn.Module):
        num_key_value_groups = 2

    torch.manual_seed(0)
    pool = torch.randn(2, 5, 2, 40, 16)  # K/V: (rows, KV heads, capacity, d), the first rows'
    key, value = pool[0, :3, :, :24], pool[1, :3, :, :24]  # first 24 slots, as the graph reads
    for width in (1, 7, _FEW_QUERIES + 1):
        query = torch.randn(3, 4, width, 16)
        allowed = torch.rand(3, width, 24) < 0.7
        allowed[..., 0] = True
        mask = torch.zeros(3, 1, width, 24).masked_fill(~allowed.unsqueeze(1), torch.finfo(torch.float32).min)
        want = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
        got, _ = _gqa_sdpa(Attention(), query, key, value, mask)
        assert torch.equal(got, want.transpose(1, 2).contiguous())  # float32: SDPA itself
        half = [t.bfloat16() for t in (query, key, value)]
        half_mask = torch.zeros_like(mask, dtype=torch.bfloat16).masked_fill(
            ~allowed.unsqueeze(1), torch.finfo(torch.bfloat16).min)
        got, _ = _gqa_sdpa(Attention(), *half, half_mask)
        assert got.dtype == torch.bfloat16
        assert torch.allclose(got.float(), want.transpose(1, 2), atol=3e-2, rtol=3e-2)
