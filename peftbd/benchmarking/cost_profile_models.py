"""The models the draft-cost profile times: one backbone of the profiled architecture carrying
every registered method's drafters, untrained (`peftbd.benchmarking.cost_profile`; each method's
`profile`: PEFT-BD's adapters are named adapters of one peft model, the heads bind to the same
backbone). A round's cost does not depend on weight values, so random ones serve where none are
local (`peftbd.models.architecture`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from peftbd.benchmarking.arms import ArmModels, synthetic_specs
from peftbd.config import Config, ConfigError
from peftbd.decoding import SpeculativeDecoder
from peftbd.decoding.graph_audit import CudaGraphUse, cuda_graph_use
from peftbd.decoding.verify import model_device
from peftbd.methods import AR, AR_ARM, ArmSpec, DraftContext, method, methods
from peftbd.models.architecture import Architecture, build_model, resolve_architecture
from peftbd.models.peft_bd import count_parameters


def profiled_specs(cfg: Config, vocab_size: int | None = None) -> list[ArmSpec]:
    """The arms the profile times (each method's `cost_arms`: the benchmark's, DFlash at several
    depths) with each method's section as the profile runs it (`Method.profile_section`: the
    early-exit arm at `cost_profile.early_exit_layers`, the head's draft vocabulary at
    `cost_profile.draft_vocab`, at most `vocab_size`) and the synthetic arms."""
    for m in methods():
        if m.profile_section is not None:
            cfg = cfg.with_section(m.id, m.profile_section(cfg, vocab_size))
    real = [AR_ARM, *(arm for m in methods() for arm in m.cost_arms(cfg))]
    return real + synthetic_specs(cfg, real)


def cost_key(models: ArmModels, spec: ArmSpec) -> tuple[Any, ...]:
    """What a round's cost depends on: the drafting settings and the module that drafts, not the
    recipe an adapter was trained with (the offsets ablation drafts exactly as `peftbd` does, on
    the same profiled module, so it is timed once)."""
    module = None if spec.method == AR else id(models.module_for(spec))
    return (spec.method, spec.denoise_steps, spec.anchored, spec.mtp_steps, spec.draft_layers,
            spec.draft_vocab, module)


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
    """One backbone of `arch` carrying every registered method's untrained drafters (`profile`)."""
    verifier = build_model(arch, dtype, device, cfg.model.attn_implementation)
    torch.manual_seed(cfg.training.seed)
    mask_id = verifier.config.vocab_size - 1  # any row: a draft's cost does not depend on it
    ctx = DraftContext(cfg, verifier, mask_id, pad_id=0,  # nothing is padded: one row is timed
                       draft_vocab=list(range(verifier.config.vocab_size)))
    modules = {key: module.eval() for m in methods() for key, module in m.cost_modules(ctx).items()}
    return ArmModels(verifier=verifier, eos_ids=[], ctx=ctx, modules=modules)


def draft_parameters(models: ArmModels) -> dict[str, int]:
    """Parameters each profiled draft module holds beside the backbone's (a head's own; 0 for an
    adapter, whose weights sit inside the backbone it wraps)."""
    base = {id(p) for p in models.verifier.parameters()}
    return {key: sum(p.numel() for p in module.parameters() if id(p) not in base)
            for key, module in models.modules.items()}


def backbone_parameters(model: torch.nn.Module) -> int:
    """Parameters of the backbone alone: the adapters' (every named adapter) and the MTP head's
    are left out; the tied embedding counts once."""
    _, total = count_parameters(model)
    adapters = sum(p.numel() for name, p in model.named_parameters()
                   if "lora_" in name or "trainable_tokens_delta" in name)
    return total - adapters


def activate(models: ArmModels, spec: ArmSpec) -> None:
    """Make `spec`'s module ready to draft where one module serves several arms (`Method.activate`)."""
    if spec.method != AR:
        method(spec.method).activate(models.module_for(spec), spec)


def graph_use(engine: SpeculativeDecoder) -> CudaGraphUse | None:
    """A count of the CUDA-graph trees' work for an engine compiled on CUDA; None elsewhere."""
    on_cuda = engine.path.compiled and model_device(engine.model).type == "cuda"
    return CudaGraphUse() if on_cuda else None


def counting(use: CudaGraphUse | None) -> contextlib.AbstractContextManager[object]:
    """Count the CUDA-graph trees' work into `use` inside the block (None: nothing to count)."""
    return contextlib.nullcontext() if use is None else cuda_graph_use(use)


def arm_run(engine: SpeculativeDecoder, use: CudaGraphUse | None) -> dict[str, Any]:
    """The `ArmRun` fields of an engine's timed arm: its model's device and dtype as they ran,
    each round forward's path, what the CUDA-graph trees did (`use`)."""
    weight = next(engine.model.parameters())
    return {"device": str(weight.device), "dtype": str(weight.dtype).removeprefix("torch."),
            "paths": engine.forward_paths(),
            "cuda_graph_replays": None if use is None else use.replays,
            "cuda_graph_skips": None if use is None else use.skips}
