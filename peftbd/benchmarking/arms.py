"""The benchmark's arms and the models they decode with.

Arms (ids from `peftbd.benchmarking.schema.ARMS`): greedy AR; PEFT-BD with one denoising step,
unanchored (the paper's main setting); its two ablations, two denoising steps and anchored; and
FastMTP. AR and FastMTP run on the plain verifier; the PEFT-BD arms on a second copy of it with the
drafter adapter attached (verifying with the adapter off, as in the paper), so the adapter's
wrapper layers never slow the baselines down.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from peftbd.config import Config
from peftbd.decoding import Drafter, MTPDrafter, PeftBDDrafter
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

    def settings(self) -> dict[str, Any]:
        """The non-empty decoding settings, for results.json."""
        keys = ("denoise_steps", "anchored", "mtp_steps")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


def arm_specs(cfg: Config) -> list[ArmSpec]:
    """Every arm, in report order, with block size and MTP steps from `cfg`."""
    d, k = cfg.drafter.block_size, cfg.mtp.num_steps
    return [
        ArmSpec("ar", "AR (greedy)", "ar"),
        ArmSpec("peftbd", f"PEFT-BD D={d}, 1 step", "peftbd", denoise_steps=1, anchored=False),
        ArmSpec("peftbd_2step", f"PEFT-BD D={d}, 2 steps", "peftbd", denoise_steps=2, anchored=False),
        ArmSpec("peftbd_anchored", f"PEFT-BD D={d}, 1 step, anchored", "peftbd", denoise_steps=1,
                anchored=True),
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

    def verifier_for(self, spec: ArmSpec) -> torch.nn.Module:
        """The model that verifies for `spec` (the adapter-carrying copy for PEFT-BD arms)."""
        return self.peft_verifier if spec.method == "peftbd" else self.verifier

    def drafter_for(self, spec: ArmSpec) -> Drafter | None:
        """The engine drafter of `spec` (None = greedy AR)."""
        if spec.method == "ar":
            return None
        if spec.method == "peftbd":
            return PeftBDDrafter(self.peft_verifier, self.mask_id, self.block_size,
                                 denoise_steps=spec.denoise_steps or 1,
                                 anchored=bool(spec.anchored))
        if spec.method == "fastmtp":
            return MTPDrafter(self.mtp_head, self.verifier, num_steps=spec.mtp_steps or 1)
        raise ValueError(f"arm {spec.id!r}: unknown method {spec.method!r}; use ar, peftbd or fastmtp")


def load_arm_models(cfg: Config, adapter_dir: str | Path, head_dir: str | Path) -> ArmModels:
    """The verifier (twice: plain, and with the drafter adapter from `adapter_dir`) and the MTP head
    from `head_dir`, on `cfg.model.device`."""
    device = resolve_device(cfg.model.device)
    tokenizer = load_tokenizer(cfg)
    verifier = load_verifier(cfg, device)
    peft_verifier = load_drafter_adapter(load_verifier(cfg, device), adapter_dir).eval()
    return ArmModels(
        verifier=verifier, peft_verifier=peft_verifier,
        mtp_head=MTPHead.from_pretrained(head_dir, verifier).eval(),
        eos_ids=eos_token_ids(verifier, tokenizer), mask_id=tokenizer.mask_token_id,
        block_size=cfg.drafter.block_size, device=device,
    )
