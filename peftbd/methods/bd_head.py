"""The block-diffusion head (beyond the paper, DFlash-style: `peftbd.models.bd_head`): a few
decoder layers of its own draft a block in one forward from the verifier's features. Its arms:
the whole vocabulary and, when `peftbd_head.draft_vocab` > 0, the artifact's N most frequent tokens
(FR-Spec)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import torch
from torch import nn

from peftbd.config_sections import Config, HeadConfig
from peftbd.decoding.bd_head_drafter import BDHeadDrafter
from peftbd.decoding.drafter import Drafter
from peftbd.layout import training_stage
from peftbd.methods.arm import ArmSpec
from peftbd.methods.registry import DraftContext, Former, Method, defaults_beside, register
from peftbd.models.bd_head import HEAD_SUBDIR, BDHead, HeadShape, saved_shape
from peftbd.training.examples import SequenceBatch
from peftbd.training.head_objective import head_drafts
from peftbd.training.head_task import HeadTask
from peftbd.training.rounds import Drafts

ID = "peftbd_head"
TRAIN_HEAD = training_stage(ID, "train block-diffusion head", reads=("data.max_new_tokens",),
                            ignores=(f"{ID}.draft_vocab",))  # the benchmark picks the draft vocabulary


def arms(cfg: Config) -> list[ArmSpec]:
    d, layers, n = cfg.peftbd_head.block_size, cfg.peftbd_head.layers, cfg.peftbd_head.draft_vocab
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
    shape = HeadShape.of(ctx.cfg.peftbd_head, ctx.verifier.config, ctx.mask_id)
    return BDHead(ctx.verifier, shape).eval().requires_grad_(False)


def feature_layers(ctx: DraftContext, path: Path | None) -> tuple[int, ...]:
    """The verifier hidden states the head `load(ctx, path)` reads: its saved json's, else
    `head`'s on this verifier; builds no module, loads no weights."""
    if path is not None:
        return saved_shape(path, ctx.verifier.config)[1].feature_layers
    return HeadShape.of(ctx.cfg.peftbd_head, ctx.verifier.config, ctx.mask_id).feature_layers


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
    return BDHeadDrafter(module, ctx.verifier, ctx.cfg.peftbd_head.block_size, vocab_ids=vocab)


def replay(drafter: Drafter, ctx: DraftContext, batch: SequenceBatch) -> tuple[Drafts, int]:
    assert isinstance(drafter, BDHeadDrafter)
    return head_drafts(drafter.head, ctx.verifier, batch, block_size=drafter.block_size,
                       pad_id=ctx.pad_id, vocab=drafter.vocab), drafter.block_size


def profile(ctx: DraftContext) -> dict[str, nn.Module]:
    """An untrained head reading DFlash's spread of three feature layers over the depth."""
    spread = dataclasses.replace(ctx.cfg.peftbd_head, feature_layers=())
    cfg = ctx.cfg.with_section(ID, spread)
    return {TRAIN_HEAD.name: load(dataclasses.replace(ctx, cfg=cfg), None)}


METHOD = register(Method(
    id=ID, label="BD head", what="block-diffusion head", config=HeadConfig,
    defaults=defaults_beside(__file__, ID), stages=(TRAIN_HEAD,),
    task=functools.partial(HeadTask, section=ID),
    export_subdir=HEAD_SUBDIR, arms=arms, positions=lambda cfg: cfg.peftbd_head.block_size,
    load=load, drafter=drafter, profile=profile, ships="features", feature_layers=feature_layers,
    replay=replay, draft_vocab=lambda cfg: cfg.peftbd_head.draft_vocab,
    former=Former(section="head", serving="peft-bd-head", dir_arg="head_dir"),
    profile_section=lambda cfg, vocab: dataclasses.replace(
        cfg.peftbd_head, draft_vocab=min(cfg.cost_profile.draft_vocab, vocab or cfg.cost_profile.draft_vocab)),
    cost_reads=("block_size", "layers", "intermediate_size", "feature_rule", "block_masks",
                "anchor_fusion"),
))
