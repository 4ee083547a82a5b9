"""Training-test fixtures: DeepSpeed engines in the test process (one rank, gloo) and a verifier of
Qwen3-0.6B's vocabulary built in the test (no download)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import pytest
import torch
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from peftbd.config import Config, OptimConfig
from peftbd.training.deepspeed_config import deepspeed_config, torch_extensions_dir

QWEN3_VOCAB = 151_936


def qwen3_stand_in(hidden: int = 64, layers: int = 2, intermediate: int = 128, heads: int = 2,
                   kv_heads: int = 1, head_dim: int = 32, seed: int = 0) -> Qwen3ForCausalLM:
    """A random Qwen3 with Qwen3-0.6B's vocabulary (151,936 rows, tied embeddings) and the given
    width and depth, in float32."""
    config = Qwen3Config(
        vocab_size=QWEN3_VOCAB, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, tie_word_embeddings=True, max_position_embeddings=2048,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).eval().requires_grad_(False)


@pytest.fixture(scope="session")
def ds_engine(tiny_cfg: Config) -> Callable[..., object]:
    """`make(module, cfg, optim=None)`: a DeepSpeed engine over `module`'s trainable parameters
    with the config `cfg.training` and `optim` (default `cfg.drafter.optim`) give, as a training
    worker builds it (one rank)."""
    import deepspeed

    if not torch.distributed.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                          LOCAL_RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir(tiny_cfg.paths.cache_dir)))

    def make(module: nn.Module, cfg: Config, optim: OptimConfig | None = None):
        trainable = [p for p in module.parameters() if p.requires_grad]
        engine, *_ = deepspeed.initialize(
            model=module, model_parameters=trainable,
            config=deepspeed_config(cfg.training, optim or cfg.drafter.optim, world_size=1))
        return engine

    yield make
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
