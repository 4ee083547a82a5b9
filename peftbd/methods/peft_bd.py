"""PEFT-BD (the paper): a LoRA adapter on the verifier drafts a block in one denoising step with
the adapter on; the adapter-off model verifies. Its arms: one step unanchored (the paper's main
setting), two steps, anchored, and beyond the paper early exit (`peftbd.early_exit_layers`:
its own adapter drafts from the first k layers) and the block-offsets ablation
(`peftbd.offsets_ablation`: an adapter trained with the other `peftbd.block_offsets`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from peft import PeftModel
from torch import nn

from peftbd.config_sections import BlockOffsets, Config, DrafterConfig
from peftbd.decoding.drafter import Drafter
from peftbd.decoding.peft_bd_drafter import PeftBDDrafter
from peftbd.layout import training_stage
from peftbd.methods.arm import ArmSpec
from peftbd.methods.registry import DraftContext, Former, Method, defaults_beside, register
from peftbd.models.early_exit import adapter_depth
from peftbd.models.peft_bd import (
    ADAPTER_SUBDIR,
    attach_drafter_adapter,
    load_drafter_adapter,
    lora_config,
    set_adapter_enabled,
)
from peftbd.training.examples import SequenceBatch
from peftbd.training.rounds import Drafts, peftbd_drafts
from peftbd.training.tasks import PeftBDTask

ID = "peftbd"
_READS, _IGNORES = ("data.max_new_tokens",), ("peftbd.early_exit_layers", "peftbd.offsets_ablation")
"""Beyond its section: the offline rounds' budget; not what it trains: the other stages' switches."""
TRAIN_PEFTBD = training_stage(ID, "train PEFT-BD adapter", reads=_READS, ignores=_IGNORES)
TRAIN_EARLY_EXIT = training_stage(
    ID, "train early-exit PEFT-BD adapter", variant="early_exit", reads=_READS, ignores=_IGNORES,
    how="--set peftbd.draft_layers=<peftbd.early_exit_layers>")
TRAIN_OFFSETS = training_stage(
    ID, "train PEFT-BD adapter, other block offsets", variant="offsets", reads=_READS,
    ignores=_IGNORES, how="--set peftbd.block_offsets=<the other of random|aligned>")
"""The block-offsets ablation (`peftbd.offsets_ablation`): the adapter trained with the other
recipe, e.g. aligned (BD3LM, the paper) beside random (the offsets the engine drafts from)."""
OTHER_OFFSETS: dict[BlockOffsets, BlockOffsets] = {"random": "aligned", "aligned": "random"}
"""`peftbd.block_offsets` -> the recipe the offsets ablation trains."""
WHOLE_ADAPTER, EARLY_EXIT_ADAPTER = "default", "early_exit"
"""The cost profile's named adapters on one backbone (the offsets ablation drafts as the whole
one does)."""


def arms(cfg: Config) -> list[ArmSpec]:
    """The PEFT-BD arms `cfg` asks for, in report order."""
    d, exit_k = cfg.peftbd.block_size, cfg.peftbd.early_exit_layers
    offsets, other = cfg.peftbd.block_offsets, OTHER_OFFSETS[cfg.peftbd.block_offsets]

    def arm(suffix: str, label: str, steps: int = 1, anchored: bool = False,
            stage: str = TRAIN_PEFTBD.name, **settings: Any) -> ArmSpec:
        return ArmSpec(ID + suffix, f"PEFT-BD D={d}, {label}", ID, stage=stage, denoise_steps=steps,
                       anchored=anchored, **{"block_offsets": offsets, **settings})

    return [
        arm("", "1 step"),
        arm("_2step", "2 steps", steps=2),
        arm("_anchored", "1 step, anchored", anchored=True),
        *([arm("_early_exit", f"1 step, first {exit_k} layer{'s' * (exit_k != 1)}",
               draft_layers=exit_k, stage=TRAIN_EARLY_EXIT.name)] if exit_k > 0 else []),
        *([arm("_offsets", f"1 step, {other} offsets", block_offsets=other,
               stage=TRAIN_OFFSETS.name)] if cfg.peftbd.offsets_ablation else []),
    ]


def stage_configs(cfg: Config) -> list[tuple[Any, Config]]:
    """The whole-backbone adapter, the early-exit one (`peftbd.early_exit_layers` > 0: trained
    with `peftbd.draft_layers` at that depth) and the offsets ablation (the other recipe)."""
    out = [(TRAIN_PEFTBD, cfg)]
    if cfg.peftbd.early_exit_layers > 0:
        drafter = dataclasses.replace(cfg.peftbd, draft_layers=cfg.peftbd.early_exit_layers)
        out.append((TRAIN_EARLY_EXIT, cfg.with_section(ID, drafter)))
    if cfg.peftbd.offsets_ablation:
        drafter = dataclasses.replace(cfg.peftbd, block_offsets=OTHER_OFFSETS[cfg.peftbd.block_offsets])
        out.append((TRAIN_OFFSETS, cfg.with_section(ID, drafter)))
    return out


def load(ctx: DraftContext, path: Path | None) -> nn.Module:
    """The verifier in `ctx` wrapped with the adapter in `path` (untrained: `drafter`'s), off."""
    if path is None:
        model = attach_drafter_adapter(ctx.verifier, ctx.cfg.peftbd, ctx.mask_id)
    else:
        model = load_drafter_adapter(ctx.verifier, path)
    model = model.to(ctx.device).eval().requires_grad_(False)
    set_adapter_enabled(model, False)  # verify with the adapter off; drafting switches it on
    return model


def drafter(module: nn.Module, ctx: DraftContext, spec: ArmSpec) -> PeftBDDrafter:
    """The arm's drafter; an early-exit arm's adapter must draft from its `draft_layers`."""
    if spec.draft_layers and adapter_depth(module) != spec.draft_layers:
        raise ValueError(
            f"arm {spec.id!r}: its adapter drafts from {adapter_depth(module)} layers but "
            f"peftbd.early_exit_layers={spec.draft_layers}; set it to match or retrain the adapter")
    return PeftBDDrafter(module, ctx.mask_id, ctx.cfg.peftbd.block_size,
                         denoise_steps=spec.denoise_steps or 1, anchored=bool(spec.anchored))


def replay(drafter: Drafter, ctx: DraftContext, batch: SequenceBatch) -> tuple[Drafts, int] | None:
    """One-step drafts of the replayed rounds (a two-step arm has no offline estimate)."""
    assert isinstance(drafter, PeftBDDrafter)
    if drafter.denoise_steps != 1:
        return None
    return peftbd_drafts(drafter.model, batch, block_size=drafter.block_size, mask_id=ctx.mask_id,
                         pad_id=ctx.pad_id, anchored=drafter.anchored), drafter.block_size


def activate(module: nn.Module, spec: ArmSpec) -> None:
    """Make `spec`'s adapter the active one where one model carries several (the cost profile)."""
    if isinstance(module, PeftModel) and EARLY_EXIT_ADAPTER in module.peft_config:
        module.set_adapter(EARLY_EXIT_ADAPTER if spec.stage == TRAIN_EARLY_EXIT.name else WHOLE_ADAPTER)


def profile(ctx: DraftContext) -> dict[str, nn.Module]:
    """One untrained peft model at `cost_profile.lora_r`, with the early-exit adapter named beside
    the whole-backbone one (`cost_profile.early_exit_layers` > 0), for all three stages."""
    cfg, early = ctx.cfg, ctx.cfg.cost_profile.early_exit_layers
    whole = dataclasses.replace(cfg.peftbd, draft_layers=0, lora_r=cfg.cost_profile.lora_r,
                                lora_alpha=cfg.cost_profile.lora_alpha)
    peft = attach_drafter_adapter(ctx.verifier, whole, ctx.mask_id)
    if early:
        peft.add_adapter(EARLY_EXIT_ADAPTER,
                         lora_config(dataclasses.replace(whole, draft_layers=early), ctx.mask_id))
        set_adapter_enabled(peft, False)
    return {s.name: peft for s in (TRAIN_PEFTBD, TRAIN_OFFSETS, TRAIN_EARLY_EXIT)}


METHOD = register(Method(
    id=ID, label="PEFT-BD", what="PEFT-BD adapter",
    config=DrafterConfig, defaults=defaults_beside(__file__, ID),
    stages=(TRAIN_PEFTBD, TRAIN_EARLY_EXIT, TRAIN_OFFSETS),
    stage_configs=stage_configs, task=PeftBDTask, export_subdir=ADAPTER_SUBDIR, arms=arms,
    positions=lambda cfg: cfg.peftbd.block_size, load=load, drafter=drafter, profile=profile,
    verifier=lambda module, ctx: module, wraps_verifier=True, activate=activate,
    ships="kv", replay=replay, former=Former(section="drafter", serving="peft-bd", dir_arg="adapter_dir"),
    profile_section=lambda cfg, vocab: dataclasses.replace(
        cfg.peftbd, early_exit_layers=cfg.cost_profile.early_exit_layers),
    cost_reads=("block_size", "target_modules", "offsets_ablation"),
))
