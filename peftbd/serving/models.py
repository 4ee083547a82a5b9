"""What a serving replica loads: the verifier, the PEFT-BD adapter, the MTP head, one decoder per
method. With no `adapter_dir` / `mtp_dir` an untrained adapter / head is attached: outputs stay
exactly the verifier's greedy output, only acceptance is low."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from peftbd.config import Config
from peftbd.decoding import MTPDrafter, PeftBDDrafter, SpeculativeDecoder
from peftbd.decoding.clock import Clock
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier, resolve_device
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import attach_drafter_adapter, load_drafter_adapter, set_adapter_enabled
from peftbd.serving.schemas import METHODS

log = logging.getLogger(__name__)


@dataclass
class ServingModels:
    """The verifier (with the drafter adapter attached when `peft-bd` is loaded; resting state:
    adapter off) and one `SpeculativeDecoder` per method, all sharing its weights."""

    model: torch.nn.Module
    decoders: dict[str, SpeculativeDecoder]
    eos_ids: list[int]
    clock: Clock

    def decoder(self, method: str) -> SpeculativeDecoder:
        """The decoder of `method`; a method this replica did not load is a clear error."""
        if method not in self.decoders:
            raise ValueError(
                f"method {method!r} is not loaded in this replica (loaded: {sorted(self.decoders)})"
            )
        return self.decoders[method]


def load_serving_models(
    cfg: Config,
    methods: Sequence[str] = METHODS,
    adapter_dir: str | Path | None = None,
    mtp_dir: str | Path | None = None,
    device: torch.device | None = None,
) -> ServingModels:
    """Load the verifier once and build the decoders of `methods` over it."""
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
    for method in methods:
        drafter = None
        if method == "peft-bd":
            drafter = PeftBDDrafter(
                model, tokenizer.mask_token_id, cfg.drafter.block_size,
                cfg.drafter.denoise_steps, cfg.drafter.anchored,
            )
        elif method == "fastmtp":
            base = verifier  # under a PeftModel, the same (adapter-off) module tree
            if mtp_dir:
                head = MTPHead.from_pretrained(mtp_dir, base)
            else:
                log.info("no mtp_dir: attaching an untrained MTP head (low acceptance)")
                torch.manual_seed(cfg.training.seed)  # the same head in every replica
                head = MTPHead(base)
            drafter = MTPDrafter(head.requires_grad_(False), base, cfg.mtp.num_steps)
        decoders[method] = SpeculativeDecoder(model, drafter, eos, budget)
    return ServingModels(model=model, decoders=decoders, eos_ids=eos, clock=Clock(device))
