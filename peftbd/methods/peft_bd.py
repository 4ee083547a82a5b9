"""PEFT-BD (the paper): a LoRA adapter on the verifier drafts a block in one denoising step with
the adapter on; the adapter-off model verifies. Its arms: one step unanchored (the paper's main
setting), two steps, anchored, and beyond the paper early exit (`drafter.early_exit_layers`:
its own adapter drafts from the first k layers) and the block-offsets ablation
(`drafter.offsets_ablation`: an adapter trained with the other `drafter.block_offsets`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from peft import PeftModel
from torch import nn

from peftbd.config_sections import Config
from peftbd.decoding.drafter import Drafter
from peftbd.decoding.peft_bd_drafter import PeftBDDrafter
from peftbd.layout import OTHER_OFFSETS, TRAIN_EARLY_EXIT, TRAIN_OFFSETS, TRAIN_PEFTBD
from peftbd.methods.arm import ArmSpec
from peftbd.methods.registry import DraftContext, Method, register
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
WHOLE_ADAPTER, EARLY_EXIT_ADAPTER = "default", "early_exit"
"""The cost profile's named adapters on one backbone (the offsets ablation drafts as the whole
one does)."""


def arms(cfg: Config) -> list[ArmSpec]:
    """The PEFT-BD arms `cfg` asks for, in report order."""
    d, exit_k = cfg.drafter.block_size, cfg.drafter.early_exit_layers
    offsets, other = cfg.drafter.block_offsets, OTHER_OFFSETS[cfg.drafter.block_offsets]

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
               stage=TRAIN_OFFSETS.name)] if cfg.drafter.offsets_ablation else []),
    ]


def stage_configs(cfg: Config) -> list[tuple[Any, Config]]:
    """The whole-backbone adapter, the early-exit one (`drafter.early_exit_layers` > 0: trained
    with `drafter.draft_layers` at that depth) and the offsets ablation (the other recipe)."""
    out = [(TRAIN_PEFTBD, cfg)]
    if cfg.drafter.early_exit_layers > 0:
        drafter = dataclasses.replace(cfg.drafter, draft_layers=cfg.drafter.early_exit_layers)
        out.append((TRAIN_EARLY_EXIT, dataclasses.replace(cfg, drafter=drafter)))
    if cfg.drafter.offsets_ablation:
        drafter = dataclasses.replace(cfg.drafter, block_offsets=OTHER_OFFSETS[cfg.drafter.block_offsets])
        out.append((TRAIN_OFFSETS, dataclasses.replace(cfg, drafter=drafter)))
    return out


def load(ctx: DraftContext, path: Path | None) -> nn.Module:
    """The verifier in `ctx` wrapped with the adapter in `path` (untrained: `drafter`'s), off."""
    if path is None:
        model = attach_drafter_adapter(ctx.verifier, ctx.cfg.drafter, ctx.mask_id)
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
            f"drafter.early_exit_layers={spec.draft_layers}; set it to match or retrain the adapter")
    return PeftBDDrafter(module, ctx.mask_id, ctx.cfg.drafter.block_size,
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
    whole = dataclasses.replace(cfg.drafter, draft_layers=0, lora_r=cfg.cost_profile.lora_r,
                                lora_alpha=cfg.cost_profile.lora_alpha)
    peft = attach_drafter_adapter(ctx.verifier, whole, ctx.mask_id)
    if early:
        peft.add_adapter(EARLY_EXIT_ADAPTER,
                         lora_config(dataclasses.replace(whole, draft_layers=early), ctx.mask_id))
        set_adapter_enabled(peft, False)
    return {s.name: peft for s in (TRAIN_PEFTBD, TRAIN_OFFSETS, TRAIN_EARLY_EXIT)}


METHOD = register(Method(
    id=ID, serving="peft-bd", kind="peftbd", label="PEFT-BD", what="PEFT-BD adapter",
    section="drafter", stages=(TRAIN_PEFTBD, TRAIN_EARLY_EXIT, TRAIN_OFFSETS),
    stage_configs=stage_configs, task=PeftBDTask, export_subdir=ADAPTER_SUBDIR, arms=arms,
    positions=lambda cfg: cfg.drafter.block_size, load=load, drafter=drafter, profile=profile,
    verifier=lambda module, ctx: module, wraps_verifier=True, activate=activate,
    dir_arg="adapter_dir", ships="kv", replay=replay,
))
