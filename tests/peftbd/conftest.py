"""Library-test fixtures: drafters whose adapter visibly changes the outputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from peft import PeftModel

from peftbd.config import Config, load_config
from peftbd.methods import DraftContext
from peftbd.models.loading import load_tokenizer, load_verifier
from peftbd.models.peft_bd import attach_drafter_adapter, set_adapter_enabled


@pytest.fixture(scope="module")
def draft_ctx(tiny_world) -> DraftContext:
    """The tiny world's `DraftContext`: its verifier (one per test module), mask and pad ids."""
    cfg = load_config("tiny")
    tok = load_tokenizer(cfg)
    return DraftContext(cfg, load_verifier(cfg), tok.mask_token_id, tok.pad_token_id)


@pytest.fixture(scope="session")
def perturbed_drafter(tiny_cfg: Config) -> Callable[..., PeftModel]:
    """`make(draft_layers=0, seed=1)`: the tiny verifier with a drafter adapter whose trainable
    weights got N(0, 0.05^2) noise (a fresh LoRA B is zero, so drafting would equal verifying),
    switched off; `draft_layers` > 0 makes it an early-exit adapter."""
    mask_id = load_tokenizer(tiny_cfg).mask_token_id

    def make(draft_layers: int = 0, seed: int = 1) -> PeftModel:
        torch.manual_seed(0)
        drafter_cfg = dataclasses.replace(tiny_cfg.peftbd, draft_layers=draft_layers)
        model = attach_drafter_adapter(load_verifier(tiny_cfg), drafter_cfg, mask_id)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn(p.shape, generator=gen))
        set_adapter_enabled(model, False)
        return model

    return make
