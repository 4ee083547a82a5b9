"""The models the draft-cost profile times: one backbone of the profiled architecture carrying
every drafter the benchmark uses, untrained (`peftbd.benchmarking.cost_profile`).

The PEFT-BD adapters are named adapters of one peft model (whole-backbone and early-exit; the
offsets ablation shares the whole-backbone one: it drafts the same way), the MTP head and the
block-diffusion head are bound to the same backbone. A round's cost does not depend on weight
values, so random ones serve where none are local (`peftbd.models.architecture`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from peft import PeftModel

from peftbd.benchmarking.arms import ArmModels, ArmSpec, arm_specs
from peftbd.config import Config, ConfigError
from peftbd.decoding.verify import unwrap
from peftbd.layout import TRAIN_EARLY_EXIT, TRAIN_OFFSETS, TRAIN_PEFTBD
from peftbd.models.architecture import Architecture, build_model, resolve_architecture
from peftbd.models.bd_head import BDHead, HeadShape
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import (
    attach_drafter_adapter,
    count_parameters,
    lora_config,
    set_adapter_enabled,
)

WHOLE_ADAPTER, EARLY_EXIT_ADAPTER = "default", "early_exit"


def profiled_specs(cfg: Config, vocab_size: int | None = None) -> list[ArmSpec]:
    """The benchmark's arms, with the early-exit arm at `cost_profile.early_exit_layers` and the
    head's draft vocabulary at `cost_profile.draft_vocab` (at most `vocab_size`)."""
    cp = cfg.cost_profile
    drafter = dataclasses.replace(cfg.drafter, early_exit_layers=cp.early_exit_layers)
    head = dataclasses.replace(cfg.head, draft_vocab=min(cp.draft_vocab, vocab_size or cp.draft_vocab))
    return arm_specs(dataclasses.replace(cfg, drafter=drafter, head=head))


def cost_key(spec: ArmSpec) -> tuple[Any, ...]:
    """What a round's cost depends on: the drafting settings, not the recipe an adapter was
    trained with (the offsets ablation drafts exactly as `peftbd` does, so it is timed once)."""
    return (spec.method, spec.denoise_steps, spec.anchored, spec.mtp_steps, spec.draft_layers,
            spec.draft_vocab)


def preflight(cfg: Config) -> Architecture:
    """The architecture to profile, checked against the settings (cheap: its config only)."""
    arch = resolve_architecture(cfg)
    depth, early = arch.config.num_hidden_layers, cfg.cost_profile.early_exit_layers
    if early >= depth:
        raise ConfigError(f"cost_profile.early_exit_layers={early}: {arch.name} has {depth} layers; "
                          f"use 1..{depth - 1}, or 0 for no early-exit arm")
    return arch


def profile_models(cfg: Config, arch: Architecture, dtype: torch.dtype,
                   device: torch.device) -> ArmModels:
    """One backbone of `arch` carrying every drafter the benchmark uses, untrained (the adapters'
    named adapters: whole-backbone and early-exit; the MTP head and the block-diffusion head
    bound to it)."""
    verifier = build_model(arch, dtype, device, cfg.model.attn_implementation)
    early = cfg.cost_profile.early_exit_layers
    torch.manual_seed(cfg.training.seed)
    mask_id = verifier.config.vocab_size - 1  # any row: a draft's cost does not depend on it
    whole = dataclasses.replace(cfg.drafter, draft_layers=0, lora_r=cfg.cost_profile.lora_r,
                                lora_alpha=cfg.cost_profile.lora_alpha)
    peft = attach_drafter_adapter(verifier, whole, mask_id)
    if early:
        peft.add_adapter(EARLY_EXIT_ADAPTER,
                         lora_config(dataclasses.replace(whole, draft_layers=early), mask_id))
        set_adapter_enabled(peft, False)
    base = unwrap(peft)
    spread = dataclasses.replace(cfg.head, feature_layers=())  # DFlash's: 3 over the depth
    head = BDHead(base, HeadShape.of(spread, base.config, mask_id)).eval()
    return ArmModels(verifier=base, mtp_head=MTPHead(base).eval(), eos_ids=[], mask_id=mask_id,
                     pad_id=0,  # nothing is padded: one round of one row is timed
                     block_size=cfg.drafter.block_size, device=device,
                     adapters={TRAIN_PEFTBD.name: peft, TRAIN_OFFSETS.name: peft,
                               TRAIN_EARLY_EXIT.name: peft},
                     bd_head=head, draft_vocab=list(range(base.config.vocab_size)))


def backbone_parameters(model: torch.nn.Module) -> int:
    """Parameters of the backbone alone: the adapters' (every named adapter) and the MTP head's
    are left out; the tied embedding counts once."""
    _, total = count_parameters(model)
    adapters = sum(p.numel() for name, p in model.named_parameters()
                   if "lora_" in name or "trainable_tokens_delta" in name)
    return total - adapters


def activate(models: ArmModels, spec: ArmSpec) -> None:
    """Make `spec`'s adapter the peft model's active one (PEFT-BD arms)."""
    if spec.method == "peftbd":
        peft = models.verifier_for(spec)
        assert isinstance(peft, PeftModel)
        peft.set_adapter(EARLY_EXIT_ADAPTER if spec.adapter == TRAIN_EARLY_EXIT.name else WHOLE_ADAPTER)
