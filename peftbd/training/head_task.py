"""The block-diffusion head's training task (`peftbd.training.distill_task.DistillTask`): the head
trains on the frozen verifier's features (`peftbd.training.head_objective`); `bd_head/` is
exported.

Eval metrics: `eval_loss` (the objective at the eval epoch's offsets), `eval_masked_token_accuracy`
(top-1 == target over the block positions), `eval_block_accepted_prefix_mean` (the leading correct
positions per training block), and, over the engine's rounds replayed on the rows,
`eval_target_token_accuracy` and `eval_accepted_prefix_mean` (the offline estimate the benchmark
compares with the engine's `mean_accepted_prefix`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel

from peftbd.config import Config
from peftbd.models.bd_head import HEAD_SUBDIR, BDHead, HeadShape
from peftbd.models.loading import DTYPES, load_tokenizer, load_verifier
from peftbd.training.block_diffusion import BlockStats, block_starts, build_draft_batch
from peftbd.training.deepspeed_config import training_dtype
from peftbd.training.distill_task import EVAL_EPOCH, head_parameter_counts, ratio
from peftbd.training.examples import SequenceBatch
from peftbd.training.head_objective import head_block_stats, head_drafts
from peftbd.training.rounds import replay_rounds, round_sums


class HeadTask:
    """The block-diffusion head on the frozen verifier (see module doc)."""

    kind = "head"
    export_subdir = HEAD_SUBDIR

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.optim = cfg.head.optim
        tokenizer = load_tokenizer(cfg)
        self.mask_id, self.pad_id = tokenizer.mask_token_id, tokenizer.pad_token_id
        self.verifier: PreTrainedModel | None = None

    def build(self, device: torch.device) -> nn.Module:
        self.verifier = load_verifier(self.cfg, device, DTYPES[training_dtype(self.cfg.training)])
        self.verifier.requires_grad_(False)
        torch.manual_seed(self.cfg.training.seed)
        return BDHead(self.verifier, HeadShape.of(self.cfg.head, self.verifier.config, self.mask_id))

    def _stats(self, module: nn.Module, batch: SequenceBatch, epoch: int) -> BlockStats:
        d, seed = self.cfg.drafter.block_size, self.cfg.training.seed
        draft = build_draft_batch(
            batch, block_starts(batch, d, "random", seed, epoch, self.cfg.head.block_stride),
            block_size=d,
            mask_id=self.mask_id, pad_id=self.pad_id, anchored=False, gamma=self.cfg.head.prefix_gamma,
            t_range=(1.0, 1.0), seed=seed, epoch=epoch, dtype=next(module.parameters()).dtype,
        )
        return head_block_stats(module, self.verifier, draft.to(batch.ids.device),
                                self.cfg.training.logits_chunk_rows)

    def train_loss(self, module: nn.Module, batch: SequenceBatch, epoch: int) -> torch.Tensor:
        return self._stats(module, batch, epoch).loss

    def eval_sums(self, module: nn.Module, batch: SequenceBatch) -> dict[str, torch.Tensor]:
        blocks = self._stats(module, batch, EVAL_EPOCH)
        d = self.cfg.drafter.block_size
        drafts = head_drafts(module, self.verifier, batch, block_size=d, pad_id=self.pad_id)
        rounds = replay_rounds(drafts, batch, budget=self.cfg.data.max_new_tokens, block_size=d)
        return {
            **round_sums(rounds),
            "weighted_loss": blocks.weighted_loss, "weight": blocks.weight,
            "correct": blocks.correct, "labelled": blocks.labelled,
            "prefix_correct": blocks.prefix_correct, "blocks": blocks.blocks,
        }

    def eval_metrics(self, sums: dict[str, torch.Tensor]) -> dict[str, float | list[float]]:
        return {
            "eval_loss": ratio(sums["weighted_loss"], sums["weight"]),
            "eval_masked_token_accuracy": ratio(sums["correct"], sums["labelled"]),
            "eval_target_token_accuracy": ratio(sums["round_accepted"], sums["round_proposed"]),
            "eval_accepted_prefix_mean": ratio(sums["round_accepted"], sums["rounds"]),
            "eval_target_tokens": int(sums["round_proposed"]),
            "eval_rounds": int(sums["rounds"]),
            "eval_block_accepted_prefix_mean": ratio(sums["prefix_correct"], sums["blocks"]),
        }

    def parameter_counts(self, module: nn.Module) -> tuple[int, int]:
        return head_parameter_counts(module, self.verifier)

    def export(self, module: nn.Module, out_dir: Path) -> Path:
        return module.save_pretrained(Path(out_dir) / HEAD_SUBDIR)
