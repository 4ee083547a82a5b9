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
    with the config `cfg.training` and `optim` (default `cfg.peftbd.optim`) give, as a training
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
            config=deepspeed_config(cfg.training, optim or cfg.peftbd.optim, world_size=1))
        return engine

    yield make
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def overfit(task, module: nn.Module, batch, steps: int, lr: float) -> list[float]:
    """Train `module`'s trainable parameters on `batch` with `task`'s loss (AdamW, the epoch is
    the step, so the noise and offsets change), leave it in eval mode; the losses."""
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=lr)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = task.train_loss(module, batch, epoch=step)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    module.eval()
    return losses


ROUNDS_BUDGET = 20
"""New tokens of the round-replay tests' rows: short, so some end on EOS and some on the budget."""


@pytest.fixture(scope="session")
def greedy_rows(tiny_cfg: Config, tiny_world) -> dict[str, list]:
    """Artifact-like rows of 16 corpus prompts whose continuations are the tiny world verifier's
    greedy output (ROUNDS_BUDGET new tokens at most), decoded once for every round-replay test
    (each checks that its engine commits exactly these tokens)."""
    import itertools
    import json

    from peftbd.data.chat import encode_prompt, prompt_messages
    from peftbd.decoding import SpeculativeDecoder
    from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier

    verifier, tokenizer = load_verifier(tiny_cfg), load_tokenizer(tiny_cfg)
    eos = eos_token_ids(verifier, tokenizer)
    with open(tiny_world.corpus_path) as f:
        records = [json.loads(line) for line in itertools.islice(f, 120)]
    prompts = [p for p in (encode_prompt(tokenizer, prompt_messages(r["messages"]))
                           for r in records) if len(p) <= 128][:16]
    # replies run ~75-170 tokens: every other prompt resumes its own greedy reply 6 tokens
    # before its EOS, so some rows end on EOS inside the budget
    whole = SpeculativeDecoder(verifier, None, eos, 256)
    for i in range(0, len(prompts), 2):
        reply = whole.decode(prompts[i]).tokens
        if reply[-1] in eos:
            prompts[i] = prompts[i] + reply[:-6]
    greedy = SpeculativeDecoder(verifier, None, eos, ROUNDS_BUDGET)
    return {"id": [str(i) for i in range(len(prompts))], "prompt_ids": prompts,
            "continuation_ids": [greedy.decode(p).tokens for p in prompts],
            "prompt_len": [len(p) for p in prompts]}


@pytest.fixture(scope="session")
def replay_is_the_engine() -> Callable[..., None]:
    """`check(task, module, batch, rows, replayed, results)`: the replayed rounds are the
    engine's decodes `results` round for round, they compare multi-token prefixes, and the
    training job's eval metrics of `batch` equal the engine's."""
    from peftbd.decoding import summarize
    from peftbd.training.evaluate import evaluate

    def check(task, module, batch, rows, replayed, results) -> None:
        for result, continuation, rounds in zip(results, rows["continuation_ids"], replayed,
                                                strict=True):
            assert result.tokens == continuation  # exact greedy: the continuation is what it commits
            assert [(x.proposed, x.accepted) for x in result.rounds] == [
                (x.proposed, x.accepted) for x in rounds]
        long_prefixes = sum(x.accepted >= 2 for row in replayed for x in row)
        assert long_prefixes >= 4, long_prefixes  # the drafter drafts: multi-token prefixes compared
        measured = summarize(results)
        offline = evaluate(task, module, [batch])
        assert offline["eval_rounds"] == measured["rounds"]
        assert offline["eval_accepted_prefix_mean"] == pytest.approx(measured["mean_accepted_prefix"])
        assert offline["eval_target_token_accuracy"] == pytest.approx(measured["token_acceptance"])

    return check
