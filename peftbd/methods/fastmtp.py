"""FastMTP (the paper's fast baseline): one shared MTP block on the verifier's final hidden
states drafts `fastmtp.num_steps` tokens a round, one step at a time."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from peftbd.config_sections import Config, MTPConfig
from peftbd.decoding.drafter import Drafter
from peftbd.decoding.mtp_drafter import MTPDrafter
from peftbd.layout import training_stage
from peftbd.methods.arm import ArmSpec
from peftbd.methods.registry import DraftContext, Former, Method, defaults_beside, register
from peftbd.models.mtp_head import HEAD_SUBDIR, MTPHead
from peftbd.training.examples import SequenceBatch
from peftbd.training.mtp_objective import mtp_drafts
from peftbd.training.rounds import Drafts
from peftbd.training.tasks import MTPTask

ID = "fastmtp"
TRAIN_MTP = training_stage(ID, "train FastMTP head")


def arms(cfg: Config) -> list[ArmSpec]:
    k = cfg.fastmtp.num_steps
    return [ArmSpec(ID, f"FastMTP ({k} steps)", ID, stage=TRAIN_MTP.name, mtp_steps=k)]


def load(ctx: DraftContext, path: Path | None) -> nn.Module:
    """The head in `path`, else an untrained one seeded by `training.seed`; frozen."""
    if path is not None:
        return MTPHead.from_pretrained(path, ctx.verifier).eval().requires_grad_(False)
    torch.manual_seed(ctx.cfg.training.seed)
    return MTPHead(ctx.verifier).eval().requires_grad_(False)


def drafter(module: nn.Module, ctx: DraftContext, spec: ArmSpec) -> MTPDrafter:
    if not isinstance(module, MTPHead):
        raise TypeError(f"FastMTP drafts with an MTPHead, not a {type(module).__name__}")
    return MTPDrafter(module, ctx.verifier, num_steps=spec.mtp_steps or ctx.cfg.fastmtp.num_steps)


def replay(drafter: Drafter, ctx: DraftContext, batch: SequenceBatch) -> tuple[Drafts, int]:
    assert isinstance(drafter, MTPDrafter)
    return mtp_drafts(drafter.head, ctx.verifier, batch, drafter.num_steps), drafter.num_steps


METHOD = register(Method(
    id=ID, label="FastMTP", what="FastMTP head", config=MTPConfig,
    defaults=defaults_beside(__file__, ID), stages=(TRAIN_MTP,), task=MTPTask,
    export_subdir=HEAD_SUBDIR, arms=arms, positions=lambda cfg: cfg.fastmtp.num_steps, load=load,
    drafter=drafter, ships="hidden", replay=replay,
    former=Former(section="mtp", dir_arg="mtp_dir"),
    cost_reads=("num_steps",),
))
