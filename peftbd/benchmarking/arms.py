"""The benchmark's arms and the models they decode with.

Arms (ids from `peftbd.benchmarking.schema.ARMS`): greedy AR; PEFT-BD with one denoising step,
unanchored (the paper's main setting); its two ablations, two denoising steps and anchored; beyond
the paper, early-exit PEFT-BD (`drafter.early_exit_layers = k`: its own adapter drafts from the
first k layers; `peftbd.models.early_exit`); and FastMTP. AR and FastMTP run on the plain
verifier; each PEFT-BD adapter on its own copy of it (verifying with the adapter off, as in the
paper), so the adapter's wrapper layers never slow the baselines down.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from peftbd.config import Config
from peftbd.decoding import Drafter, MTPDrafter, PeftBDDrafter
from peftbd.models.early_exit import adapter_depth
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier, resolve_device
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import load_drafter_adapter


@dataclass(frozen=True)
class ArmSpec:
    """One arm: id, report label, method (ar | peftbd | fastmtp) and its decoding settings."""

    id: str
    label: str
    method: str
    denoise_steps: int | None = None
    anchored: bool | None = None
    mtp_steps: int | None = None
    draft_layers: int | None = None  # an early-exit arm: its adapter drafts from this many layers

    def settings(self) -> dict[str, Any]:
        """The non-empty decoding settings, for results.json."""
        keys = ("denoise_steps", "anchored", "mtp_steps", "draft_layers")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


def arm_specs(cfg: Config) -> list[ArmSpec]:
    """Every arm, in report order, with block size, MTP steps and the early-exit depth (none
    when `drafter.early_exit_layers` is 0) from `cfg`."""
    d, k, exit_k = cfg.drafter.block_size, cfg.mtp.num_steps, cfg.drafter.early_exit_layers
    early_exit = [ArmSpec("peftbd_early_exit", f"PEFT-BD D={d}, 1 step, first {exit_k} layers",
                          "peftbd", denoise_steps=1, anchored=False, draft_layers=exit_k)]
    return [
        ArmSpec("ar", "AR (greedy)", "ar"),
        ArmSpec("peftbd", f"PEFT-BD D={d}, 1 step", "peftbd", denoise_steps=1, anchored=False),
        ArmSpec("peftbd_2step", f"PEFT-BD D={d}, 2 steps", "peftbd", denoise_steps=2, anchored=False),
        ArmSpec("peftbd_anchored", f"PEFT-BD D={d}, 1 step, anchored", "peftbd", denoise_steps=1,
                anchored=True),
        *(early_exit if exit_k > 0 else []),
        ArmSpec("fastmtp", f"FastMTP ({k} steps)", "fastmtp", mtp_steps=k),
    ]


@dataclass
class ArmModels:
    """Everything a timing worker decodes with, loaded once."""

    verifier: PreTrainedModel  # plain: AR and FastMTP
    peft_verifier: torch.nn.Module  # a second copy with the drafter adapter (PEFT-BD arms)
    mtp_head: MTPHead
    eos_ids: list[int]
    mask_id: int
    block_size: int
    device: torch.device
    early_exit_verifier: torch.nn.Module | None = None  # a third copy: the early-exit adapter

    def verifier_for(self, spec: ArmSpec) -> torch.nn.Module:
        """The model that verifies for `spec` (the adapter-carrying copy for PEFT-BD arms)."""
        if spec.draft_layers:
            if self.early_exit_verifier is None:
                raise ValueError(f"arm {spec.id!r} needs an early-exit adapter; none was loaded")
            return self.early_exit_verifier
        return self.peft_verifier if spec.method == "peftbd" else self.verifier

    def drafter_for(self, spec: ArmSpec) -> Drafter | None:
        """The engine drafter of `spec` (None = greedy AR)."""
        if spec.method == "ar":
            return None
        if spec.method == "peftbd":
            return PeftBDDrafter(self.verifier_for(spec), self.mask_id, self.block_size,
                                 denoise_steps=spec.denoise_steps or 1,
                                 anchored=bool(spec.anchored))
        if spec.method == "fastmtp":
            return MTPDrafter(self.mtp_head, self.verifier, num_steps=spec.mtp_steps or 1)
        raise ValueError(f"arm {spec.id!r}: unknown method {spec.method!r}; use ar, peftbd or fastmtp")


def load_arm_models(cfg: Config, adapter_dir: str | Path, head_dir: str | Path,
                    early_exit_dir: str | Path | None = None) -> ArmModels:
    """The verifier (plain, with the drafter adapter from `adapter_dir`, and with the early-exit
    adapter from `early_exit_dir` when given) and the MTP head from `head_dir`, on
    `cfg.model.device`."""
    device = resolve_device(cfg.model.device)
    tokenizer = load_tokenizer(cfg)
    verifier = load_verifier(cfg, device)
    peft_verifier = load_drafter_adapter(load_verifier(cfg, device), adapter_dir).eval()
    early_exit = None
    if early_exit_dir is not None:
        early_exit = load_drafter_adapter(load_verifier(cfg, device), early_exit_dir).eval()
        depth = adapter_depth(early_exit)
        if depth != cfg.drafter.early_exit_layers:
            raise ValueError(
                f"the early-exit adapter in {str(early_exit_dir)!r} drafts from "
                f"{depth} layers but drafter.early_exit_layers="
                f"{cfg.drafter.early_exit_layers}; set it to match or retrain the adapter"
            )
    return ArmModels(
        verifier=verifier, peft_verifier=peft_verifier,
        mtp_head=MTPHead.from_pretrained(head_dir, verifier).eval(),
        eos_ids=eos_token_ids(verifier, tokenizer), mask_id=tokenizer.mask_token_id,
        block_size=cfg.drafter.block_size, device=device, early_exit_verifier=early_exit,
    )
