"""The fast path (`peftbd.decoding.fast_path`): the compiled verify forward decodes exactly the
eager engine's tokens and rounds, at batch 1 and batch > 1, for AR and every drafter family;
compile time is kept apart from steady state."""

from __future__ import annotations

import pytest
import torch

from peftbd.decoding import BDHeadDrafter, MTPDrafter, PeftBDDrafter, SpeculativeDecoder
from peftbd.models.bd_head import BDHead, HeadShape
from peftbd.models.loading import load_verifier
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import attach_drafter_adapter

pytestmark = pytest.mark.slow  # a few compiles (10-60 s each on 2 cores, less from inductor's cache)

BUDGETS = [20, 7, 16, 12]


@pytest.fixture(scope="module")
def model(tiny_cfg, tokenizer):
    """The verifier with an untrained PEFT-BD adapter: every arm's model."""
    torch.manual_seed(0)
    return attach_drafter_adapter(load_verifier(tiny_cfg), tiny_cfg.peftbd, tokenizer.mask_token_id)


def _drafter(name: str, model, tiny_cfg, mask: int):
    if name == "peftbd":
        return PeftBDDrafter(model, mask, 8)
    if name == "fastmtp":
        return MTPDrafter(MTPHead(model), model, num_steps=3)
    if name == "peftbd_head":  # keeps verifier features: its verify stays eager
        return BDHeadDrafter(BDHead(model, HeadShape.of(tiny_cfg.peftbd_head, model.config, mask)), model, 8)
    return None


def _rounds(results) -> list:
    return [(r.tokens, [(x.proposed, x.accepted, x.emitted) for x in r.rounds]) for r in results]


@pytest.mark.parametrize("name", ["ar", "peftbd", "fastmtp", "peftbd_head"])
def test_the_fast_path_decodes_the_eager_output(model, tiny_cfg, tokenizer, prompts, eos, name):
    drafter = _drafter(name, model, tiny_cfg, tokenizer.mask_token_id)
    rows = [ids for _, ids in prompts] + [prompts[0][1][:9]]
    eager = SpeculativeDecoder(model, drafter, eos)
    fast = SpeculativeDecoder(model, drafter, eos, fast_path=True)
    want = _rounds(eager.decode(p, n) for p, n in zip(rows, BUDGETS))
    assert _rounds(fast.decode(p, n) for p, n in zip(rows, BUDGETS)) == want  # batch 1
    assert _rounds(fast.decode_many(rows, 3, BUDGETS)) == want  # batch 3 -> 1, rows joining late


def test_compile_time_is_counted_apart(verifier, prompts, eos):
    fast = SpeculativeDecoder(verifier, None, eos, 6, fast_path=True)
    fast.decode(prompts[0][1])
    assert fast.fast.compiles == 1 and fast.fast.compile_s > 0  # the AR step at batch 1
    compile_s = fast.fast.compile_s
    fast.decode(prompts[1][1])  # other lengths, the same graph
    assert (fast.fast.compiles, fast.fast.compile_s) == (1, compile_s)
