"""Bring your own drafter (docs/adding-a-drafter.md), followed to the letter: this file alone
defines a toy drafter (a low-rank bigram model: the next token from the last one), its training
task and its `Method`, registers it, and gets it trained a few steps (the Ray-free schedule the
training job runs), benchmarked with the exact greedy audit, costed by the cost profile and
served by the replicas' model loader: no other file knows it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from peftbd.benchmarking import cost_profile as cp
from peftbd.benchmarking.arms import DrafterDirs
from peftbd.benchmarking.prompts import Prompt
from peftbd.benchmarking.runner import run_shard
from peftbd.config import Config, load_config
from peftbd.decoding import SpeculativeDecoder
from peftbd.decoding.state import DecodeState, timed
from peftbd.layout import GENERATE
from peftbd.methods import AR_ARM, ArmSpec, DraftContext, Method, methods, register, unregister
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier
from peftbd.serving.models import load_serving_models
from peftbd.stage import StageSpec
from peftbd.training.checkpoint import TrainState
from peftbd.training.deepspeed_config import BatchPlan, batch_plan
from peftbd.training.examples import SequenceBatch, collate_sequences
from peftbd.training.memory import StepMemory, step_memory
from peftbd.training.schedule import Schedule, WorkerData, train

STEPS, RANK, DRAFT = 12, 16, 3
TOY_STAGE = StageSpec("train_toy", "train the toy bigram drafter", "toy_bigram",
                      reads=("model", "mtp", "training"), inputs=(GENERATE,),
                      code=(__name__,), command="(a test)")


class Bigram(nn.Module):
    """logits(next | last) = U[last] V: a rank-`RANK` bigram table."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.u = nn.Embedding(vocab, RANK)
        self.v = nn.Linear(RANK, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.v(self.u(ids))


class BigramDrafter:
    """Chains the bigram's argmax from each request's last token: reads no verifier state."""

    name = "toy_bigram"
    reads_kv_layers: int | None = 0
    reads_hidden = False
    feature_layers: tuple[int, ...] = ()

    def __init__(self, model: Bigram) -> None:
        self.model = model

    def start(self, state: DecodeState) -> None:
        state.drafter_state = None

    @torch.no_grad()
    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        device = next(self.model.parameters()).device
        token = torch.tensor([[s.tokens[-1]] for s in states], device=device)
        drafts = []
        for _ in range(max(min(DRAFT, m) for m in max_tokens) if states else 0):
            with timed(states, "draft"):
                token = self.model(token).argmax(-1)
            drafts.append(token)
        block = torch.cat(drafts, 1) if drafts else token[:, :0]
        return [block[i : i + 1, : min(DRAFT, m)] for i, m in enumerate(max_tokens)]


class BigramTask:
    """Next-token cross-entropy over each row's continuation (the `DistillTask` contract)."""

    export_subdir = "toy_bigram"
    block_size = None

    def __init__(self, cfg: Config) -> None:
        self.cfg, self.optim = cfg, cfg.mtp.optim  # a test method borrows mtp's optimizer

    def build(self, device: torch.device) -> nn.Module:
        vocab = int(load_verifier(self.cfg, device).config.vocab_size)  # the LM head's rows
        torch.manual_seed(self.cfg.training.seed)
        return Bigram(vocab).to(device)

    def _sums(self, module: nn.Module, batch: SequenceBatch) -> dict[str, torch.Tensor]:
        ids = batch.ids
        pos = torch.arange(ids.shape[1] - 1, device=ids.device)
        keep = (pos >= batch.prompt_lens[:, None] - 1) & (pos < batch.lengths[:, None] - 1)
        logits = module(ids[:, :-1])[keep]
        target = ids[:, 1:][keep]
        return {"loss": F.cross_entropy(logits, target, reduction="sum"),
                "correct": (logits.argmax(-1) == target).sum(), "count": keep.sum()}

    def train_loss(self, module: nn.Module, batch: SequenceBatch, epoch: int) -> torch.Tensor:
        sums = self._sums(module, batch)
        return sums["loss"] / sums["count"].clamp_min(1)

    def eval_sums(self, module: nn.Module, batch: SequenceBatch) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return self._sums(module, batch)

    def eval_metrics(self, sums: dict[str, torch.Tensor]) -> dict[str, float | list[float]]:
        n = max(float(sums["count"]), 1.0)
        return {"eval_loss": float(sums["loss"]) / n, "eval_target_token_accuracy": float(sums["correct"]) / n}

    def parameter_counts(self, module: nn.Module) -> tuple[int, int]:
        n = sum(p.numel() for p in module.parameters())
        return n, n

    def step_memory(self, model_config: Any, trainable: int, total: int, plan: BatchPlan,
                    dtype: str) -> StepMemory:
        return step_memory("mtp", self.cfg, model_config, trainable, total, plan, dtype)

    def export(self, module: nn.Module, out_dir: Path) -> Path:
        path = Path(out_dir) / self.export_subdir
        path.mkdir(parents=True, exist_ok=True)
        torch.save(module.state_dict(), path / "bigram.pt")
        return path


def _load(ctx: DraftContext, path: Path | None) -> nn.Module:
    torch.manual_seed(ctx.cfg.training.seed)
    model = Bigram(int(ctx.verifier.config.vocab_size)).to(ctx.device)
    if path is not None:
        model.load_state_dict(torch.load(Path(path) / "toy_bigram" / "bigram.pt"))
    return model.eval().requires_grad_(False)


TOY = Method(
    id="toy_bigram", serving="toy-bigram", kind="toy", label="Toy bigram", what="toy bigram drafter",
    section="mtp", stages=(TOY_STAGE,), task=BigramTask, export_subdir="toy_bigram",
    arms=lambda cfg: [ArmSpec("toy_bigram", f"Toy bigram ({DRAFT} tokens)", "toy_bigram",
                              stage=TOY_STAGE.name)],
    positions=lambda cfg: DRAFT, load=_load,
    drafter=lambda module, ctx, spec: BigramDrafter(module),
    profile=lambda ctx: {TOY_STAGE.name: _load(ctx, None)}, dir_arg="toy_dir",
)


@pytest.fixture
def toy():
    register(TOY)
    try:
        yield TOY
    finally:
        unregister(TOY.id)


def _greedy_rows(cfg: Config, n: int) -> tuple[list[dict], list[Prompt]]:
    """`n` one-row micro-batches of the tiny verifier's own greedy continuations of random
    prompts (what the drafter learns to predict), and the prompts."""
    tok, verifier = load_tokenizer(cfg), load_verifier(cfg, torch.device("cpu"))
    ar = SpeculativeDecoder(verifier, None, eos_token_ids(verifier, tok), 24)
    gen = torch.Generator().manual_seed(3)
    prompts = [Prompt(f"p{i}", torch.randint(10, len(tok) - 10, (12,), generator=gen).tolist())
               for i in range(n)]
    rows = [{"id": [p.id], "prompt_ids": [p.prompt_ids], "continuation_ids": [ar.decode(p.prompt_ids).tokens],
             "prompt_len": [len(p.prompt_ids)]} for p in prompts]
    return rows, prompts


def test_a_drafter_defined_here_trains_benchmarks_costs_and_serves(toy, ds_engine, tiny_world, tmp_path):
    cfg = load_config("tiny", overrides=["training.micro_batch_size=1",
                                         f"mtp.optim.max_steps={STEPS}", "mtp.optim.global_batch_size=2",
                                         "mtp.optim.lr=0.05", f"mtp.optim.eval_every={STEPS}",
                                         "decoding.max_new_tokens=24"])
    assert toy in methods()
    # trained: the training job's schedule, without Ray
    task = toy.task(cfg)
    engine = ds_engine(task.build(torch.device("cpu")), cfg, task.optim)
    rows, prompts = _greedy_rows(cfg, 8)
    pad_id = load_tokenizer(cfg).pad_token_id
    schedule = Schedule.of(task.optim, batch_plan(cfg.training, task.optim, 1), STEPS, len(rows))
    losses: dict[int, float] = {}
    data = WorkerData(lambda: iter(rows), lambda r: collate_sequences(r, pad_id),
                      [collate_sequences(rows[0], pad_id)])
    trained = train(engine, task, schedule, TrainState(), data, lambda *a, **k: None,
                    lambda done, total, loss: losses.__setitem__(done, loss))
    assert trained.state.step == STEPS and losses[STEPS] < losses[1]
    out = tmp_path / "train_toy"
    task.export(engine.module, out)

    # benchmarked, with the exact greedy audit and acceptance of its own
    specs = [AR_ARM, *toy.arms(cfg)]
    shard = run_shard(cfg, DrafterDirs({TOY_STAGE.name: str(out)}), specs, prompts[:4], repeats=1)
    assert set(shard.results) == {"ar", "toy_bigram"}
    assert shard.mismatches["toy_bigram"] == []
    toy_runs, ar_runs = shard.results["toy_bigram"][0], shard.results["ar"][0]
    assert [r.tokens for r in toy_runs] == [r.tokens for r in ar_runs]
    assert sum(r.accepted for run in toy_runs for r in run.rounds) > 0  # it learnt some bigrams

    # costed: the cost profile times every registered method, this one included
    profile = cp.run_profile(load_config("tiny", overrides=[
        "cost_profile.architecture=model", "cost_profile.early_exit_layers=1", "cost_profile.repeats=1", "cost_profile.kv_len=16",
        "cost_profile.dtypes=[float32]", "cost_profile.decode_tokens=0"])).to_dict()
    toy_cost = json.loads(json.dumps(profile))["profiles"]["float32"]["arms"]["toy_bigram"]
    assert toy_cost["method"] == "toy_bigram" and toy_cost["draft_calls"] == DRAFT
    assert toy_cost["draft_ms_round"] > 0

    # served: what both Serve apps' replicas load, by its serving name, exact
    served = load_serving_models(cfg, ["ar", toy.serving], {toy.serving: str(out)})
    prompt = prompts[0].prompt_ids
    assert served.decoder(toy.serving).decode(prompt, 16).tokens == served.decoder("ar").decode(prompt, 16).tokens
