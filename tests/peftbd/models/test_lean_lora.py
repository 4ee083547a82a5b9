"""The lean LoRA forward drafts bit-identically to peft's own, and leaves nothing behind."""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from peftbd.config import load_config
from peftbd.models.lean_lora import lean_lora
from peftbd.models.peft_bd import adapter_on, attach_drafter_adapter

MASK = 99


def _drafter(dropout: float = 0.0):
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         tie_word_embeddings=True)
    drafter = dataclasses.replace(load_config("tiny").peftbd, lora_dropout=dropout)
    model = attach_drafter_adapter(Qwen3ForCausalLM(config).eval(), drafter, MASK)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a trained adapter: B is no longer zero
            torch.nn.init.normal_(p, std=0.5)
    return model.eval()


@torch.inference_mode()
def _logits(model, lean: bool) -> torch.Tensor:
    ids = torch.tensor([[5, 6, 7, MASK, MASK, MASK]])
    with adapter_on(model), (lean_lora(model) if lean else contextlib.nullcontext()):
        return model(input_ids=ids).logits


def test_lean_drafts_equal_peft_s_bit_for_bit():
    model = _drafter()
    peft_logits, lean_logits = _logits(model, lean=False), _logits(model, lean=True)
    assert torch.equal(peft_logits, lean_logits)
    with torch.inference_mode():
        off = model(input_ids=torch.tensor([[5, 6, 7]])).logits
    assert not torch.equal(off, peft_logits[:, :3])  # the adapter does change the draft
    lora = [m for m in model.modules() if type(m).__name__ == "Linear" and hasattr(m, "lora_A")]
    assert lora and not any("forward" in vars(m) for m in lora)  # restored after the block


def test_layers_with_dropout_keep_peft_s_forward():
    model = _drafter(dropout=0.1)
    with lean_lora(model):
        lora = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
        assert lora and not any("forward" in vars(m) for m in lora)


def test_the_active_adapter_decides_which_weights_run():
    model = _drafter()
    model.add_adapter("other", model.peft_config["default"])
    for name, p in model.named_parameters():
        if "lora_B.other" in name:
            torch.nn.init.normal_(p, std=0.5)
    default = _logits(model, lean=True)
    model.set_adapter("other")
    other_peft, other_lean = _logits(model, lean=False), _logits(model, lean=True)
    assert torch.equal(other_peft, other_lean) and not torch.equal(default, other_lean)
