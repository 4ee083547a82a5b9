"""The block-diffusion head (beyond the paper, DFlash-style: `peftbd.models.bd_head`): a few
decoder layers of its own draft a block in one forward from the verifier's features. Its arms:
the whole vocabulary and, when `head.draft_vocab` > 0, the artifact's N most frequent tokens
(FR-Spec)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from peftbd.config_sections import Config
from peftbd.decoding.bd_head_drafter import BDHeadDrafter
from peftbd.decoding.drafter import Drafter
from peftbd.layout import TRAIN_HEAD
from peftbd.methods.arm import ArmSpec
from peftbd.methods.registry import DraftContext, Method, register
from peftbd.models.bd_head import HEAD_SUBDIR, BDHead, HeadShape, saved_shape
from peftbd.training.examples import SequenceBatch
from peftbd.training.head_objective import head_drafts
from peftbd.training.head_task import HeadTask
from peftbd.training.rounds import Drafts

ID = "peftbd_head"


def arms(cfg: Config) -> list[ArmSpec]:
    d, layers, n = cfg.drafter.block_size, cfg.head.layers, cfg.head.draft_vocab
    label = f"BD head D={d}"
    return [
        ArmSpec(ID, f"{label}, {layers} layer{'s' * (layers != 1)}", ID, stage=TRAIN_HEAD.name),
        *([ArmSpec(f"{ID}_vocab", f"{label}, top-{n} draft vocab", ID, stage=TRAIN_HEAD.name,
                   draft_vocab=n)] if n > 0 else []),
    ]


def load(ctx: DraftContext, path: Path | None) -> nn.Module:
    """The head in `path`, else an untrained one of `head`'s shape seeded by `training.seed`."""
    if path is not None:
        return BDHead.from_pretrained(path, ctx.verifier).eval().requires_grad_(False)
    torch.manual_seed(ctx.cfg.training.seed)
    shape = HeadShape.of(ctx.cfg.head, ctx.verifier.config, ctx.mask_id)
    return BDHead(ctx.verifier, shape).eval().requires_grad_(False)


def feature_layers(ctx: DraftContext, path: Path | None) -> tuple[int, ...]:
    """The verifier hidden states the head `load(ctx, path)` reads: its saved json's, else
    `head`'s on this verifier; builds no module, loads no weights."""
    if path is not None:
        return saved_shape(path, ctx.verifier.config)[1].feature_layers
    return HeadShape.of(ctx.cfg.head, ctx.verifier.config, ctx.mask_id).feature_layers


def drafter(module: nn.Module, ctx: DraftContext, spec: ArmSpec) -> BDHeadDrafter:
    """The head's drafter; a vocabulary arm drafts over the first `spec.draft_vocab` tokens of
    the artifact's draft vocabulary."""
    vocab = None
    if spec.draft_vocab:
        if not ctx.draft_vocab or len(ctx.draft_vocab) < spec.draft_vocab:
            raise ValueError(f"arm {spec.id!r} drafts over {spec.draft_vocab} tokens but the "
                             f"loaded draft vocabulary has {len(ctx.draft_vocab or [])}")
        vocab = torch.tensor(list(ctx.draft_vocab[: spec.draft_vocab]))
    if not isinstance(module, BDHead):
        raise TypeError(f"the head drafts with a BDHead, not a {type(module).__name__}")
    return BDHeadDrafter(module, ctx.verifier, ctx.cfg.drafter.block_size, vocab_ids=vocab)


def replay(drafter: Drafter, ctx: DraftContext, batch: SequenceBatch) -> tuple[Drafts, int]:
    assert isinstance(drafter, BDHeadDrafter)
    return head_drafts(drafter.head, ctx.verifier, batch, block_size=drafter.block_size,
                       pad_id=ctx.pad_id, vocab=drafter.vocab), drafter.block_size


def profile(ctx: DraftContext) -> dict[str, nn.Module]:
    """An untrained head reading DFlash's spread of three feature layers over the depth."""
    spread = dataclasses.replace(ctx.cfg.head, feature_layers=())
    cfg = dataclasses.replace(ctx.cfg, head=spread)
    return {TRAIN_HEAD.name: load(dataclasses.replace(ctx, cfg=cfg), None)}


METHOD = register(Method(
    id=ID, serving="peft-bd-head", kind="head", label="BD head", what="block-diffusion head",
    section="head", stages=(TRAIN_HEAD,), task=HeadTask, export_subdir=HEAD_SUBDIR, arms=arms,
    positions=lambda cfg: cfg.drafter.block_size, load=load, drafter=drafter, profile=profile,
    dir_arg="head_dir", ships="features", feature_layers=feature_layers, replay=replay,
))
