"""DFlash (z-lab/dflash, trained as SpecForge's DFlash trainer does): the block-diffusion head
(`peftbd.models.bd_head`, the same module and drafter as `peftbd.methods.bd_head`) with DFlash's
published recipe, the `dflash` section: one verifier feature layer per head layer at DFlash's
spacing, a block of D positions drafting D - 1 tokens, exp(-j / 7) loss weights and up to 512
random anchors per sequence. One arm; the cost profile times it at `cost_profile.dflash_layers`
head layers."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from torch import nn

from peftbd.config_sections import Config, HeadConfig
from peftbd.layout import training_stage
from peftbd.methods.bd_head import ID as HEAD_ID
from peftbd.methods.bd_head import drafter, feature_layers as head_features, load as load_head, replay
from peftbd.methods.arm import ArmSpec
from peftbd.methods.registry import DraftContext, Method, defaults_beside, register
from peftbd.models.bd_head import HEAD_SUBDIR, drafted
from peftbd.training.head_task import HeadTask

ID = "dflash"
TRAIN_DFLASH = training_stage(ID, "train DFlash head", reads=("data.max_new_tokens",),
                              ignores=(f"{ID}.draft_vocab",))


def _label(cfg: Config, layers: int) -> str:
    return f"DFlash head D={cfg.dflash.block_size}, {layers} layer{'s' * (layers != 1)}"


def arms(cfg: Config) -> list[ArmSpec]:
    return [ArmSpec(ID, _label(cfg, cfg.dflash.layers), ID, stage=TRAIN_DFLASH.name)]


def profile_stage(layers: int) -> str:
    """The cost profile's key of the untrained DFlash head of `layers` layers."""
    return f"{TRAIN_DFLASH.name}@{layers}"


def profile_arms(cfg: Config) -> list[ArmSpec]:
    """DFlash at each of `cost_profile.dflash_layers` head layers: the run's own depth
    (`dflash.layers`) as its arm "dflash", so the report projects it with this run's acceptance,
    the others as dflash_<k>layer(s)."""
    return [ArmSpec(ID if k == cfg.dflash.layers else f"{ID}_{k}layer{'s' * (k != 1)}",
                    _label(cfg, k), ID, stage=profile_stage(k))
            for k in cfg.cost_profile.dflash_layers]


def _as_head(ctx: DraftContext, section: HeadConfig) -> DraftContext:
    """`ctx` with `section` as the block-diffusion head's: that method's code builds from it."""
    return dataclasses.replace(ctx, cfg=ctx.cfg.with_section(HEAD_ID, section))


def load(ctx: DraftContext, path: Path | None) -> nn.Module:
    """The head in `path`, else an untrained one of `dflash`'s shape seeded by `training.seed`."""
    return load_head(_as_head(ctx, ctx.cfg.dflash), path)


def feature_layers(ctx: DraftContext, path: Path | None) -> tuple[int, ...]:
    """The verifier hidden states the head `load(ctx, path)` reads (`dflash`'s when untrained)."""
    return head_features(_as_head(ctx, ctx.cfg.dflash), path)


def profile(ctx: DraftContext) -> dict[str, nn.Module]:
    """An untrained DFlash head per `cost_profile.dflash_layers` depth, each reading its own
    DFlash feature layers of the profiled architecture (`feature_rule` over its depth)."""
    out = {}
    for k in ctx.cfg.cost_profile.dflash_layers:
        section = dataclasses.replace(ctx.cfg.dflash, layers=k, feature_layers=())
        out[profile_stage(k)] = load_head(_as_head(ctx, section), None)
    return out


METHOD = register(Method(
    id=ID, label="DFlash head", what="DFlash head", config=HeadConfig,
    defaults=defaults_beside(__file__, ID), stages=(TRAIN_DFLASH,),
    task=functools.partial(HeadTask, section=ID), export_subdir=HEAD_SUBDIR, arms=arms,
    profile_arms=profile_arms, positions=lambda cfg: drafted(cfg.dflash.block_masks, cfg.dflash.block_size),
    load=load, drafter=drafter, profile=profile, ships="features", feature_layers=feature_layers,
    replay=replay,
    cost_reads=("block_size", "intermediate_size", "feature_rule", "block_masks", "anchor_fusion"),
))
