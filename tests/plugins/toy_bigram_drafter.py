"""A drafting method from outside the project's packages (docs/adding-a-drafter.md), as a user
writes one: this file alone defines a toy drafter (a low-rank bigram model: the next token from
the last one), its config section, its training task and its `Method`, and registers it. A config
names it in `methods.plugins: [toy_bigram_drafter]` (this directory on PYTHONPATH); every process
that loads that config imports it, so the main job trains, benchmarks, audits and reports it and
both Serve apps serve it, with no edit to the project."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from peftbd.config import Config, OptimConfig
from peftbd.decoding.state import DecodeState, timed
from peftbd.layout import training_stage
from peftbd.methods import ArmSpec, DraftContext, Method, register
from peftbd.models.loading import load_verifier
from peftbd.training.deepspeed_config import BatchPlan
from peftbd.training.examples import SequenceBatch
from peftbd.training.memory import StepMemory, step_memory

ID = "toy_bigram"
STAGE = training_stage(ID, "train the toy bigram drafter", code=(__name__,))


@dataclass(frozen=True)
class ToyBigramConfig:
    """The section `toy_bigram`: draft length, the bigram table's rank, its optimizer."""

    draft_tokens: int
    rank: int
    optim: OptimConfig


DEFAULTS = {
    "draft_tokens": 3, "rank": 16,
    "optim": {"lr": 0.05, "warmup_ratio": 0.0, "weight_decay": 0.0, "scheduler": "constant",
              "global_batch_size": 2, "max_steps": 12, "eval_every": 12, "checkpoint_every": 12,
              "eval_batches": 1},
}


class Bigram(nn.Module):
    """logits(next | last) = U[last] V: a rank-`rank` bigram table."""

    def __init__(self, vocab: int, rank: int) -> None:
        super().__init__()
        self.u = nn.Embedding(vocab, rank)
        self.v = nn.Linear(rank, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.v(self.u(ids))


class BigramDrafter:
    """Chains the bigram's argmax from each request's last token: reads no verifier state."""

    name = "toy_bigram"
    reads_kv_layers: int | None = 0
    reads_hidden = False
    feature_layers: tuple[int, ...] = ()

    def __init__(self, model: Bigram, draft_tokens: int) -> None:
        self.model, self.draft_tokens = model, draft_tokens

    def start(self, state: DecodeState) -> None:
        state.drafter_state = None

    @torch.no_grad()
    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        device = next(self.model.parameters()).device
        token = torch.tensor([[s.tokens[-1]] for s in states], device=device)
        k = self.draft_tokens
        drafts = []
        for _ in range(max(min(k, m) for m in max_tokens) if states else 0):
            with timed(states, "draft"):
                token = self.model(token).argmax(-1)
            drafts.append(token)
        block = torch.cat(drafts, 1) if drafts else token[:, :0]
        return [block[i : i + 1, : min(k, m)] for i, m in enumerate(max_tokens)]


class BigramTask:
    """Next-token cross-entropy over each row's continuation (the `DistillTask` contract)."""

    export_subdir = "toy_bigram"
    block_size = None

    def __init__(self, cfg: Config) -> None:
        self.cfg, self.section = cfg, getattr(cfg, ID)
        self.optim = self.section.optim

    def build(self, device: torch.device) -> nn.Module:
        verifier_config = load_verifier(self.cfg, device).config
        torch.manual_seed(self.cfg.training.seed)
        model = Bigram(int(verifier_config.vocab_size), self.section.rank).to(device)  # the LM head's rows
        model.config = verifier_config  # the model config the job's step-memory estimate reads
        return model

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


def load(ctx: DraftContext, path: Path | None) -> nn.Module:
    """The trained bigram in `path`, else an untrained one seeded by `training.seed`."""
    torch.manual_seed(ctx.cfg.training.seed)
    model = Bigram(int(ctx.verifier.config.vocab_size), getattr(ctx.cfg, ID).rank).to(ctx.device)
    if path is not None:
        model.load_state_dict(torch.load(Path(path) / "toy_bigram" / "bigram.pt"))
    return model.eval().requires_grad_(False)


def drafter(module: nn.Module, ctx: DraftContext, spec: ArmSpec) -> BigramDrafter:
    assert isinstance(module, Bigram)
    return BigramDrafter(module, getattr(ctx.cfg, ID).draft_tokens)


METHOD = register(Method(
    id=ID, label="Toy bigram", what="toy bigram drafter", config=ToyBigramConfig, defaults=DEFAULTS,
    stages=(STAGE,), task=BigramTask, export_subdir="toy_bigram",
    arms=lambda cfg: [ArmSpec(ID, f"Toy bigram ({getattr(cfg, ID).draft_tokens} tokens)", ID,
                              stage=STAGE.name)],
    positions=lambda cfg: getattr(cfg, ID).draft_tokens, load=load, drafter=drafter,
))
