"""Training checkpoints hold only what trains: at Qwen3-0.6B's vocabulary (151,936 rows, the
tied table under peft's token adapter) a PEFT-BD checkpoint is within a small factor of its
trainable parameters, and it resumes to the same trainable weights."""

from __future__ import annotations

import pytest
import torch

from peftbd.config import load_config
from peftbd.models.peft_bd import adapter_on, attach_drafter_adapter, count_parameters
from peftbd.training.checkpoint import TrainState, frozen_names, load_checkpoint, save_checkpoint

from .conftest import QWEN3_VOCAB, qwen3_stand_in

MASK_ID = 151_669  # Qwen3's <|mask|> (load_tokenizer adds it below the 151,936 rows)


def _drafter():
    cfg = load_config("qwen3-0.6b")
    torch.manual_seed(0)
    return attach_drafter_adapter(qwen3_stand_in(), cfg.peftbd, MASK_ID)


def test_frozen_names_include_the_tied_heads_copy():
    model = _drafter()
    names = frozen_names(model)
    assert any(n.endswith("embed_tokens.token_adapter.base_layer.weight") for n in names)
    assert any(n.endswith("lm_head.token_adapter.base_layer.weight") for n in names)
    assert not any("lora_" in n or "trainable_tokens_delta" in n for n in names)


def _size(path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.mark.slow
@pytest.mark.parametrize("setting", [
    ["training.zero_stage=0", "training.precision=fp32"],  # the tiny preset's
    ["training.zero_stage=2", "training.precision=bf16"],  # the qwen3-0.6b preset's
], ids=["zero0-fp32", "zero2-bf16"])
def test_peftbd_checkpoint_holds_only_what_trains_at_the_real_vocabulary(ds_engine, tmp_path, setting):
    cfg = load_config("qwen3-0.6b", overrides=["model.device=cpu", "peftbd.optim.global_batch_size=1",
                                                "training.micro_batch_size=1", *setting])
    model = _drafter()
    trainable, total = count_parameters(model)
    table_bytes = QWEN3_VOCAB * model.config.hidden_size * 4
    assert table_bytes > 200 * trainable * 4  # the frozen table dwarfs what trains
    engine = ds_engine(model, cfg)
    ids = torch.tensor([[5, 6, MASK_ID, 7]])
    with adapter_on(engine.module):
        loss = engine.module(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    save_checkpoint(engine, tmp_path / "ckpt", TrainState(step=1), "fp")
    size = _size(tmp_path / "ckpt")
    # weights + AdamW's two moments (+ bf16's fp32 master copy) = 12-14 bytes per trainable
    # parameter, plus pickling overhead; the frozen table would be >= 200x the trainable bytes
    assert size <= 5 * trainable * 4 + 2**20, (size, trainable)

    fresh = ds_engine(_drafter_perturbed(), cfg)
    assert load_checkpoint(fresh, tmp_path / "ckpt", "fp") == TrainState(step=1)
    for (name, a), b in zip(engine.module.named_parameters(), fresh.module.parameters()):
        if a.requires_grad:
            assert torch.equal(a, b), name


def _drafter_perturbed():
    model = _drafter()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(1.0)  # the checkpoint must overwrite every trainable tensor
    return model
