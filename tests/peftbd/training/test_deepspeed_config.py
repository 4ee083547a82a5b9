"""The DeepSpeed config: the repo's ds_zero.json filled from the config tree."""

from __future__ import annotations

import dataclasses

import pytest

from peftbd.config import ConfigError, load_config
from peftbd.training.deepspeed_config import batch_plan, deepspeed_config, training_dtype


def test_tiny_config_is_zero0_fp32_torch_adamw_with_warmup_cosine():
    cfg = load_config("tiny")
    ds = deepspeed_config(cfg.training, cfg.peftbd.optim, world_size=2)
    optim = cfg.peftbd.optim
    assert ds["zero_optimization"]["stage"] == 0
    assert ds["bf16"]["enabled"] is False
    assert ds["train_batch_size"] == optim.global_batch_size
    assert ds["train_micro_batch_size_per_gpu"] * 2 * ds["gradient_accumulation_steps"] == optim.global_batch_size
    assert ds["optimizer"] == {"type": "AdamW", "params": {
        "lr": optim.lr, "weight_decay": optim.weight_decay, "betas": [0.9, 0.999], "eps": 1e-8,
        "torch_adam": True}}
    assert ds["scheduler"]["type"] == "WarmupCosineLR"
    assert ds["scheduler"]["params"]["total_num_steps"] == optim.max_steps


def test_paper_config_is_bf16_zero2_on_every_device():
    cfg = load_config("qwen3-0.6b")
    ds = deepspeed_config(cfg.training, cfg.fastmtp.optim, world_size=1)
    assert ds["bf16"]["enabled"] is True and ds["zero_optimization"]["stage"] == 2
    assert ds["optimizer"]["params"]["weight_decay"] == 0.1
    cpu = load_config("qwen3-0.6b", overrides=["model.device=cpu"])  # bf16 is what runs on CPU too
    assert deepspeed_config(cpu.training, cpu.fastmtp.optim, 1)["bf16"]["enabled"] is True
    assert training_dtype(cpu.training) == "bfloat16"
    assert training_dtype(load_config("tiny").training) == "float32"


def test_micro_batches_and_accumulation():
    cfg = load_config("tiny", overrides=["training.micro_batch_size=2"])
    plan = batch_plan(cfg.training, cfg.peftbd.optim, world_size=2)
    assert (plan.micro_batch, plan.accumulation) == (2, cfg.peftbd.optim.global_batch_size // 4)
    assert plan.steps_per_epoch(rows=101) == 101 // 2 // 2 // plan.accumulation
    with pytest.raises(ConfigError, match="fewer than one global batch"):
        plan.steps_per_epoch(rows=3)


@pytest.mark.parametrize("change, match", [
    ({"global_batch_size": 7}, "multiple of training.num_workers"),
    ({"scheduler": "linear"}, "cosine, constant"),
])
def test_bad_values_are_named(change, match):
    cfg = load_config("tiny")
    with pytest.raises(ConfigError, match=match):
        deepspeed_config(cfg.training, dataclasses.replace(cfg.peftbd.optim, **change), 2)
    with pytest.raises(ConfigError, match="micro_batch_size=3"):
        batch_plan(dataclasses.replace(cfg.training, micro_batch_size=3), cfg.peftbd.optim, 2)
