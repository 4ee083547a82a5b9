"""The PEFT-BD and FastMTP distillation tasks (`peftbd.training.distill_task.DistillTask`; the
block-diffusion head's: `head_task`; each method names its task in `peftbd.methods`).

PEFT-BD trains a `PeftModel` whose only trainable tensors are LoRA and the mask-token row and
exports `adapter/` (`PeftModel.save_pretrained`); FastMTP trains the `MTPHead` and exports
`mtp_head/` (`MTPHead.save_pretrained`).

Eval metrics (all over the rows of the val split that are evaluated; see `docs/architecture.md`):

- `eval_loss`: the training objective with a fixed eval noise seed.
- `eval_masked_token_accuracy` (PEFT-BD): top-1 == target over the masked real block positions,
  t ~ U[mask_ratio_min, mask_ratio_max]; `..._t1`: the same with every block fully masked
  (t = 1), which is how inference drafts.
- `eval_target_token_accuracy`: the fraction of draft targets that greedy verification would
  accept: a target counts when the draft is right there and at every earlier position of its
  draft. `eval_accepted_prefix_mean`: the accepted tokens per draft, bonus excluded. PEFT-BD:
  over the engine's rounds replayed on the rows (`peftbd.training.rounds`), the offline
  `token_acceptance` and `mean_accepted_prefix`; `eval_block_...` the same over t = 1 blocks at
  the training blocks' starts. FastMTP: the same over its replayed rounds (`mtp_drafts`);
  `eval_teacher_forced_...` over the K steps of a round at every position, teacher forced.
- `eval_step_accuracy` (FastMTP): teacher-forced top-1 accuracy of each step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
from peft import PeftModel
from torch import nn
from transformers import PreTrainedModel

from peftbd.config import Config
from peftbd.models.loading import DTYPES, load_tokenizer, load_verifier
from peftbd.models.mtp_head import HEAD_SUBDIR, MTPHead
from peftbd.models.peft_bd import (
    ADAPTER_SUBDIR,
    attach_drafter_adapter,
    count_parameters,
    set_adapter_enabled,
)
from peftbd.training.block_diffusion import (
    BlockStats,
    block_diffusion_stats,
    block_starts,
    build_draft_batch,
)
from peftbd.training.deepspeed_config import BatchPlan, training_dtype
from peftbd.training.distill_task import EVAL_EPOCH, head_parameter_counts, ratio
from peftbd.training.evaluate import ROWS
from peftbd.training.examples import SequenceBatch
from peftbd.training.memory import StepMemory, step_memory
from peftbd.training.mtp_objective import mtp_drafts, mtp_stats
from peftbd.training.rounds import (
    accepted_prefix_ci95,
    peftbd_drafts,
    replay_rounds,
    round_sums,
    row_values,
)


class PeftBDTask:
    """LoRA block-diffusion drafter on the frozen verifier (`peftbd.training.block_diffusion`)."""

    export_subdir = ADAPTER_SUBDIR

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.optim = cfg.peftbd.optim
        self.block_size: int | None = cfg.peftbd.block_size
        tokenizer = load_tokenizer(cfg)
        self.mask_id, self.pad_id = tokenizer.mask_token_id, tokenizer.pad_token_id

    def build(self, device: torch.device) -> nn.Module:
        torch.manual_seed(self.cfg.training.seed)  # LoRA A init draws from the global RNG
        verifier = load_verifier(self.cfg, device, DTYPES[training_dtype(self.cfg.training)])
        model = attach_drafter_adapter(verifier, self.cfg.peftbd, self.mask_id)
        set_adapter_enabled(model, False)
        return model

    def _stats(
        self, module: nn.Module, batch: SequenceBatch, epoch: int, t_range: tuple[float, float]
    ) -> BlockStats:
        d, seed = self.cfg.peftbd, self.cfg.training.seed
        draft = build_draft_batch(
            batch, block_starts(batch, d.block_size, d.block_offsets, seed, epoch),
            block_size=d.block_size, mask_id=self.mask_id, pad_id=self.pad_id,
            anchored=d.anchored, gamma=d.prefix_gamma, t_range=t_range,
            seed=seed, epoch=epoch, dtype=next(module.parameters()).dtype,
        )
        return block_diffusion_stats(module, draft.to(batch.ids.device),
                                     self.cfg.training.logits_chunk_rows)

    def _t_range(self) -> tuple[float, float]:
        return self.cfg.peftbd.mask_ratio_min, self.cfg.peftbd.mask_ratio_max

    def train_loss(self, module: nn.Module, batch: SequenceBatch, epoch: int) -> torch.Tensor:
        return self._stats(module, batch, epoch, self._t_range()).loss

    def eval_sums(self, module: nn.Module, batch: SequenceBatch) -> dict[str, torch.Tensor]:
        noised = self._stats(module, batch, EVAL_EPOCH, self._t_range())
        full = self._stats(module, batch, EVAL_EPOCH, (1.0, 1.0))
        d = self.cfg.peftbd
        drafts = peftbd_drafts(module, batch, block_size=d.block_size, mask_id=self.mask_id,
                               pad_id=self.pad_id, anchored=d.anchored)
        # the continuations' budget is the engine's (data.max_new_tokens)
        rounds = replay_rounds(drafts, batch, budget=self.cfg.data.max_new_tokens,
                               block_size=d.block_size)
        return {
            **round_sums(rounds), ROWS: row_values(rounds),
            "weighted_loss": noised.weighted_loss, "weight": noised.weight,
            "correct": noised.correct, "labelled": noised.labelled,
            "weighted_loss_t1": full.weighted_loss, "weight_t1": full.weight,
            "correct_t1": full.correct, "labelled_t1": full.labelled,
            "prefix_correct_t1": full.prefix_correct, "blocks_t1": full.blocks,
        }

    def eval_metrics(self, sums: dict[str, torch.Tensor]) -> dict[str, float | list[float] | None]:
        return {
            "eval_loss": ratio(sums["weighted_loss"], sums["weight"]),
            "eval_loss_t1": ratio(sums["weighted_loss_t1"], sums["weight_t1"]),
            "eval_masked_token_accuracy": ratio(sums["correct"], sums["labelled"]),
            "eval_masked_token_accuracy_t1": ratio(sums["correct_t1"], sums["labelled_t1"]),
            "eval_target_token_accuracy": ratio(sums["round_accepted"], sums["round_proposed"]),
            "eval_accepted_prefix_mean": ratio(sums["round_accepted"], sums["rounds"]),
            "eval_accepted_prefix_ci95": accepted_prefix_ci95(sums[ROWS]),
            "eval_target_tokens": int(sums["round_proposed"]),
            "eval_rounds": int(sums["rounds"]),
            "eval_block_target_token_accuracy": ratio(sums["prefix_correct_t1"], sums["labelled_t1"]),
            "eval_block_accepted_prefix_mean": ratio(sums["prefix_correct_t1"], sums["blocks_t1"]),
        }

    def parameter_counts(self, module: nn.Module) -> tuple[int, int]:
        return count_parameters(module)

    def step_memory(self, model_config: Any, trainable: int, total: int, plan: BatchPlan,
                    dtype: str) -> StepMemory:
        return step_memory("adapter", self.cfg, model_config, trainable, total, plan, dtype)

    def export(self, module: nn.Module, out_dir: Path) -> Path:
        path = Path(out_dir) / ADAPTER_SUBDIR
        cast(PeftModel, module).save_pretrained(str(path))  # what `build` returned
        return path


class MTPTask:
    """FastMTP head on the frozen verifier's hidden states (`peftbd.training.mtp_objective`)."""

    export_subdir = HEAD_SUBDIR
    block_size: int | None = None

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.optim = cfg.fastmtp.optim
        self.verifier: PreTrainedModel | None = None

    def build(self, device: torch.device) -> nn.Module:
        self.verifier = load_verifier(self.cfg, device, DTYPES[training_dtype(self.cfg.training)])
        torch.manual_seed(self.cfg.training.seed)
        return MTPHead(self.verifier)

    def train_loss(self, module: nn.Module, batch: SequenceBatch, epoch: int) -> torch.Tensor:
        return self._stats(module, batch)["loss"]

    def _stats(self, module: nn.Module, batch: SequenceBatch) -> dict[str, torch.Tensor]:
        return mtp_stats(_mtp_head(module), self.verifier, batch, self.cfg.fastmtp.loss_weights,
                         self.cfg.training.logits_chunk_rows)

    def eval_sums(self, module: nn.Module, batch: SequenceBatch) -> dict[str, torch.Tensor]:
        sums = self._stats(module, batch)
        del sums["loss"]
        k = self.cfg.fastmtp.num_steps
        rounds = replay_rounds(mtp_drafts(_mtp_head(module), self.verifier, batch, k), batch,
                               budget=self.cfg.data.max_new_tokens, block_size=k)
        return {**sums, **{f"replayed_{key}": value for key, value in round_sums(rounds).items()},
                ROWS: row_values(rounds)}

    def eval_metrics(self, sums: dict[str, torch.Tensor]) -> dict[str, float | list[float] | None]:
        per_step = sums["ce_sum"] / sums["targets"].clamp_min(1)
        weights = torch.tensor(self.cfg.fastmtp.loss_weights, dtype=per_step.dtype)
        return {
            "eval_loss": float((weights * per_step).sum()),
            "eval_step_accuracy": [
                ratio(c, n) for c, n in zip(sums["correct"], sums["targets"], strict=True)],
            "eval_target_token_accuracy": ratio(sums["replayed_round_accepted"],
                                                sums["replayed_round_proposed"]),
            "eval_accepted_prefix_mean": ratio(sums["replayed_round_accepted"],
                                               sums["replayed_rounds"]),
            "eval_accepted_prefix_ci95": accepted_prefix_ci95(sums[ROWS]),
            "eval_target_tokens": int(sums["replayed_round_proposed"]),
            "eval_rounds": int(sums["replayed_rounds"]),
            "eval_teacher_forced_target_token_accuracy": ratio(sums["prefix_correct"],
                                                               sums["round_targets"]),
            "eval_teacher_forced_accepted_prefix_mean": ratio(sums["prefix_correct"], sums["rounds"]),
        }

    def parameter_counts(self, module: nn.Module) -> tuple[int, int]:
        assert self.verifier is not None, "build() first"
        return head_parameter_counts(module, self.verifier)

    def step_memory(self, model_config: Any, trainable: int, total: int, plan: BatchPlan,
                    dtype: str) -> StepMemory:
        return step_memory("mtp", self.cfg, model_config, trainable, total, plan, dtype)

    def export(self, module: nn.Module, out_dir: Path) -> Path:
        return _mtp_head(module).save_pretrained(Path(out_dir) / HEAD_SUBDIR)


def _mtp_head(module: nn.Module) -> MTPHead:
    """`module` as the head `MTPTask.build` made (the training job passes DeepSpeed's
    `engine.module`: that very module)."""
    assert isinstance(module, MTPHead), type(module)
    return module

