"""The block-diffusion head's training task (`peftbd.training.distill_task.DistillTask`): the head
trains on the frozen verifier's features (`peftbd.training.head_objective`); `bd_head/` is
exported. One task trains any `HeadConfig` section: `peftbd_head`, or `dflash` (DFlash's recipe): its
`block_masks` sets the drafted block (D or D - 1 tokens), `anchors` its blocks' starts (every
`block_stride`, or random: `block_diffusion.random_starts`), `loss_decay` the loss weights.

Eval metrics: `eval_loss` (the objective at the eval epoch's offsets), `eval_masked_token_accuracy`
(top-1 == target over the block positions), `eval_block_accepted_prefix_mean` (the leading correct
positions per training block), and, over the engine's rounds replayed on the rows,
`eval_target_token_accuracy` and `eval_accepted_prefix_mean` (the offline estimate the benchmark
compares with the engine's `mean_accepted_prefix`) with `eval_accepted_prefix_ci95`, its 95%
interval over the rows (`peftbd.training.rounds.accepted_prefix_ci95`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from peftbd.config import Config, HeadConfig
from peftbd.models.bd_head import HEAD_SUBDIR, BDHead, HeadShape, drafted, feature_layers
from peftbd.models.loading import DTYPES, load_tokenizer, load_verifier
from peftbd.training.block_diffusion import (
    BlockStats,
    block_starts,
    build_draft_batch,
    random_starts,
)
from peftbd.training.deepspeed_config import BatchPlan, training_dtype
from peftbd.training.distill_task import EVAL_EPOCH, head_parameter_counts, ratio
from peftbd.training.evaluate import ROWS
from peftbd.training.examples import SequenceBatch
from peftbd.training.memory import StepMemory, step_memory
from peftbd.training.head_objective import head_block_stats, head_drafts
from peftbd.training.rounds import accepted_prefix_ci95, replay_rounds, round_sums, row_values


class HeadTask:
    """The block-diffusion head on the frozen verifier, as config section `section` (a
    `HeadConfig`: "peftbd_head" or "dflash") asks (see module doc)."""

    export_subdir = HEAD_SUBDIR

    def __init__(self, cfg: Config, section: str) -> None:
        self.cfg = cfg
        self.head_cfg: HeadConfig = getattr(cfg, section)
        self.optim = self.head_cfg.optim
        self.draft_len = drafted(self.head_cfg.block_masks, self.head_cfg.block_size)  # D or D - 1
        self.block_size: int | None = self.draft_len
        tokenizer = load_tokenizer(cfg)
        self.mask_id, self.pad_id = tokenizer.mask_token_id, tokenizer.pad_token_id
        self.verifier: PreTrainedModel | None = None

    def build(self, device: torch.device) -> nn.Module:
        self.verifier = load_verifier(self.cfg, device, DTYPES[training_dtype(self.cfg.training)])
        self.verifier.requires_grad_(False)
        torch.manual_seed(self.cfg.training.seed)
        return BDHead(self.verifier, HeadShape.of(self.head_cfg, self.verifier.config, self.mask_id))

    def _stats(self, module: nn.Module, batch: SequenceBatch, epoch: int) -> BlockStats:
        h, d, seed = self.head_cfg, self.draft_len, self.cfg.training.seed
        starts = (random_starts(batch, h.anchors, seed, epoch) if h.anchors
                  else block_starts(batch, d, "random", seed, epoch, h.block_stride))
        draft = build_draft_batch(
            batch, starts, block_size=d,
            mask_id=self.mask_id, pad_id=self.pad_id, anchored=h.anchored, gamma=h.prefix_gamma,
            t_range=(1.0, 1.0), seed=seed, epoch=epoch, dtype=next(module.parameters()).dtype,
            decay=h.loss_decay,
        )
        return head_block_stats(_bd_head(module), self.verifier, draft.to(batch.ids.device),
                                self.cfg.training.logits_chunk_rows)

    def train_loss(self, module: nn.Module, batch: SequenceBatch, epoch: int) -> torch.Tensor:
        return self._stats(module, batch, epoch).loss

    def eval_sums(self, module: nn.Module, batch: SequenceBatch) -> dict[str, torch.Tensor]:
        blocks = self._stats(module, batch, EVAL_EPOCH)
        d = self.draft_len
        drafts = head_drafts(_bd_head(module), self.verifier, batch, block_size=d, pad_id=self.pad_id)
        rounds = replay_rounds(drafts, batch, budget=self.cfg.data.max_new_tokens, block_size=d)
        return {
            **round_sums(rounds), ROWS: row_values(rounds),
            "weighted_loss": blocks.weighted_loss, "weight": blocks.weight,
            "correct": blocks.correct, "labelled": blocks.labelled,
            "prefix_correct": blocks.prefix_correct, "blocks": blocks.blocks,
        }

    def eval_metrics(self, sums: dict[str, torch.Tensor]) -> dict[str, float | list[float] | None]:
        return {
            "eval_loss": ratio(sums["weighted_loss"], sums["weight"]),
            "eval_masked_token_accuracy": ratio(sums["correct"], sums["labelled"]),
            "eval_target_token_accuracy": ratio(sums["round_accepted"], sums["round_proposed"]),
            "eval_accepted_prefix_mean": ratio(sums["round_accepted"], sums["rounds"]),
            "eval_accepted_prefix_ci95": accepted_prefix_ci95(sums[ROWS]),
            "eval_target_tokens": int(sums["round_proposed"]),
            "eval_rounds": int(sums["rounds"]),
            "eval_block_accepted_prefix_mean": ratio(sums["prefix_correct"], sums["blocks"]),
        }

    def parameter_counts(self, module: nn.Module) -> tuple[int, int]:
        assert self.verifier is not None, "build() first"
        return head_parameter_counts(module, self.verifier)

    def step_memory(self, model_config: Any, trainable: int, total: int, plan: BatchPlan,
                    dtype: str) -> StepMemory:
        assert self.verifier is not None, "build() first"
        features = len(feature_layers(self.head_cfg, self.verifier.config))
        return step_memory("head", self.cfg, model_config, trainable, total, plan, dtype,
                           head=self.head_cfg, head_features=features)

    def export(self, module: nn.Module, out_dir: Path) -> Path:
        return _bd_head(module).save_pretrained(Path(out_dir) / HEAD_SUBDIR)


def _bd_head(module: nn.Module) -> BDHead:
    """`module` as the head `HeadTask.build` made (the training job passes DeepSpeed's
    `engine.module`: that very module)."""
    assert isinstance(module, BDHead), type(module)
    return module
