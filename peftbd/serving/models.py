"""What a serving replica loads: the verifier, the PEFT-BD adapter, the MTP head, the
block-diffusion head, one decoder per method. With no `adapter_dir` / `mtp_dir` / `head_dir` an
untrained adapter / head is attached: outputs stay exactly the verifier's greedy output, only
acceptance is low."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from peftbd.config import Config
from peftbd.decoding import BDHeadDrafter, MTPDrafter, NoDrafter, PeftBDDrafter, SpeculativeDecoder
from peftbd.decoding.clock import Clock
from peftbd.decoding.controlled import ControlledDrafter, GreedyOracle
from peftbd.models.bd_head import BDHead, HeadShape, feature_layers, saved_head
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier, resolve_device
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import attach_drafter_adapter, load_drafter_adapter, set_adapter_enabled
from peftbd.serving.schemas import METHODS
from peftbd.serving.synthetic import synthetic_profiles

log = logging.getLogger(__name__)


@dataclass
class ServingModels:
    """The verifier (with the drafter adapter attached when `peft-bd` is loaded; resting state:
    adapter off) and one `SpeculativeDecoder` per method, all sharing its weights."""

    model: torch.nn.Module
    decoders: dict[str, SpeculativeDecoder]
    eos_ids: list[int]
    clock: Clock
    taps: dict[str, SpeculativeDecoder]
    """Per method whose drafter reads verifier features: a drafter-less decoder over the same
    verifier whose forwards keep them (`FeatureTap`), for a split verifier replica."""
    shipped: dict[str, str]
    """Per method, what a split verifier ships its drafter each round (`SHIPPED`), when it does."""

    def decoder(self, method: str) -> SpeculativeDecoder:
        """The decoder of `method`; a method this replica did not load is a clear error."""
        if method not in self.decoders:
            raise ValueError(
                f"method {method!r} is not loaded in this replica (loaded: {sorted(self.decoders)})"
            )
        return self.decoders[method]

    def verifier_decoder(self, method: str) -> SpeculativeDecoder:
        """What a split verifier replica runs for a request of `method`: greedy AR, keeping the
        verifier features that method's remote drafter reads (none for most methods)."""
        return self.taps.get(method) or self.decoder("ar")


SHIPPED = {"peft-bd-head": "features", "fastmtp": "hidden", "peft-bd": "kv"}
"""What a split verifier ships each method's drafter (`peftbd.serving.features`): the head
always; the others under `serving.drafter_sync: ship`."""


class FeatureTap(NoDrafter):
    """Proposes nothing (a split verifier), but makes every verifier forward of the request keep
    `feature_layers` in `state.features`, for a drafter in another process."""

    def __init__(self, layers: Sequence[int]) -> None:
        self.feature_layers = tuple(layers)


def head_feature_layers(cfg: Config, verifier_config, head_dir: str | Path | None) -> tuple[int, ...]:
    """The verifier hidden states the served block-diffusion head reads: those its saved shape
    records (`head_dir`), else those `cfg.head` gives an untrained one."""
    if head_dir:
        return HeadShape.saved(saved_head(head_dir)[1]).feature_layers
    return tuple(feature_layers(cfg.head, verifier_config))


def load_serving_models(
    cfg: Config,
    methods: Sequence[str] = METHODS,
    adapter_dir: str | Path | None = None,
    mtp_dir: str | Path | None = None,
    device: torch.device | None = None,
    head_dir: str | Path | None = None,
    references: dict[tuple[int, ...], Sequence[int]] | None = None,
) -> ServingModels:
    """Load the verifier once and build the decoders of `methods` over it (and the feature taps
    a split verifier needs for the head, whichever methods it loads). The methods of
    `serving.synthetic` draft under controlled acceptance; their oracle knows `references`
    ({prompt ids: greedy AR output}) and decodes any other prompt with greedy AR when first seen."""
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {list(METHODS)}")
    if cfg.decoding.torch_threads > 0:  # the replica's intra-op threads, as the benchmark's
        torch.set_num_threads(cfg.decoding.torch_threads)
    device = device or resolve_device(cfg.model.device)
    tokenizer = load_tokenizer(cfg)
    verifier = load_verifier(cfg, device)
    eos = eos_token_ids(verifier, tokenizer)
    model: torch.nn.Module = verifier
    if "peft-bd" in methods:
        if adapter_dir:
            model = load_drafter_adapter(verifier, adapter_dir)
        else:
            log.info("no adapter_dir: attaching an untrained PEFT-BD adapter (low acceptance)")
            model = attach_drafter_adapter(verifier, cfg.drafter, tokenizer.mask_token_id)
        model = model.to(device).eval().requires_grad_(False)
        set_adapter_enabled(model, False)  # verify with the adapter off; drafting switches it on
    budget = cfg.serving.max_tokens_cap
    decoders: dict[str, SpeculativeDecoder] = {}
    profiles = synthetic_profiles(cfg)
    ar = SpeculativeDecoder(model, None, eos, budget)
    oracle = GreedyOracle(lambda prompt, n: ar.decode(prompt, n).tokens, budget, references)
    for method in methods:
        drafter = None
        if method == "peft-bd":
            drafter = PeftBDDrafter(
                model, tokenizer.mask_token_id, cfg.drafter.block_size,
                cfg.drafter.denoise_steps, cfg.drafter.anchored,
            )
        elif method == "fastmtp":  # the verifier: under a PeftModel, the same (adapter-off) tree
            head = _head("mtp_dir", mtp_dir, cfg.training.seed,
                         lambda d: MTPHead.from_pretrained(d, verifier), lambda: MTPHead(verifier))
            drafter = MTPDrafter(head, verifier, cfg.mtp.num_steps)
        elif method == "peft-bd-head":
            head = _head("head_dir", head_dir, cfg.training.seed,
                         lambda d: BDHead.from_pretrained(d, verifier),
                         lambda: BDHead(verifier, HeadShape.of(cfg.head, verifier.config,
                                                               tokenizer.mask_token_id)))
            drafter = BDHeadDrafter(head, verifier, cfg.drafter.block_size)
        if drafter is not None and method in profiles:
            drafter = ControlledDrafter(drafter, profiles[method], oracle,
                                        cfg.decoding.synthetic_seed)
        decoders[method] = SpeculativeDecoder(model, drafter, eos, budget)
    layers = head_feature_layers(cfg, verifier.config, head_dir)
    taps = {"peft-bd-head": SpeculativeDecoder(model, FeatureTap(layers), eos, budget)}
    shipped = {m: kind for m, kind in SHIPPED.items()
               if kind == "features" or cfg.serving.drafter_sync == "ship"}
    return ServingModels(model=model, decoders=decoders, eos_ids=eos, clock=Clock(device), taps=taps,
                         shipped=shipped)


def _head(arg: str, head_dir: str | Path | None, seed: int, load, build) -> torch.nn.Module:
    """A trained head from `head_dir` (`load`), else an untrained one (`build`) seeded by
    `seed`, so every replica builds the same; frozen either way."""
    if head_dir:
        return load(head_dir).requires_grad_(False)
    log.info("no %s: attaching an untrained head (low acceptance)", arg)
    torch.manual_seed(seed)
    return build().requires_grad_(False)
