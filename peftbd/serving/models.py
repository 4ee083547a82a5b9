"""What a serving replica loads: the verifier once and, per method it serves (`peftbd.methods`),
the method's draft module (`Method.load`: trained from its `drafter_dirs` entry, else untrained:
outputs stay exactly the verifier's greedy output, only acceptance is low) and one decoder that
drafts with the method's first arm."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ContextManager

import torch

from peftbd.config import Config
from peftbd.decoding import SpeculativeDecoder
from peftbd.decoding.clock import Clock
from peftbd.decoding.controlled import ControlledDrafter, GreedyOracle
from peftbd.decoding.drafter import Drafter
from peftbd.methods import AR, DraftContext, Method, by_serving, serving_names
from peftbd.methods import methods as registered
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier, resolve_device
from peftbd.serving.remote_drafter import DrafterCalls, RemoteDrafter
from peftbd.serving.synthetic import synthetic_profiles

log = logging.getLogger(__name__)

DrafterDirs = Mapping[str, str | Path | None]
"""{serving name: a method's trained output dir} (absent or None: untrained)."""


@dataclass
class ServingModels:
    """The model every decoder verifies with (the verifier, or the one a method wraps it in,
    e.g. PEFT-BD's adapter, whose resting state is off) and one `SpeculativeDecoder` per method,
    all sharing its weights."""

    model: torch.nn.Module
    decoders: dict[str, SpeculativeDecoder]
    eos_ids: list[int]
    clock: Clock
    feature_layers: dict[str, tuple[int, ...]]
    """Per method whose drafter reads verifier features: those layers (a split verifier keeps
    them for the method's remote drafter)."""
    shipped: dict[str, str]
    """Per method, what a split verifier ships its drafter each round (`Method.ships`), when it does."""

    def decoder(self, method: str) -> SpeculativeDecoder:
        """The decoder of `method`; a method this replica did not load is a clear error."""
        if method not in self.decoders:
            raise ValueError(
                f"method {method!r} is not loaded in this replica (loaded: {sorted(self.decoders)})"
            )
        return self.decoders[method]

    def remote_decoder(self, method: str, calls: DrafterCalls, draft_ahead: bool = False,
                       may_ahead: Callable[[], bool] = lambda: True,
                       wait: Callable[[], ContextManager[object]] = contextlib.nullcontext
                       ) -> SpeculativeDecoder:
        """What a split verifier replica runs for requests of `method`: this replica's verifier
        with a `RemoteDrafter` proposing through `calls` (keeping and shipping what the method's
        drafter reads; the other arguments are its own), or greedy AR as it is."""
        ar = self.decoder(AR)
        if method == AR:
            return ar
        if method not in serving_names():
            raise ValueError(f"unknown method {method!r}; choose from {list(serving_names())}")
        drafter = RemoteDrafter(method, calls, self.shipped.get(method),
                                self.feature_layers.get(method, ()), draft_ahead, may_ahead, wait)
        return SpeculativeDecoder(ar.model, drafter, ar.eos_ids, ar.max_new_tokens,
                                  prefill_chunk=ar.prefill_chunk)


def _build_drafter(m: Method, ctx: DraftContext, path: str | Path | None
                   ) -> tuple[torch.nn.Module, Drafter]:
    """`m`'s draft module (trained from `path`, else untrained and seeded, logged) and the drafter
    of its first arm over it."""
    if not path and m.trains:
        log.info("no %s: serving an untrained %s (low acceptance)", m.dir_arg, m.what)
    module = m.load(ctx, Path(path) if path else None)
    return module, m.drafter(module, ctx, m.arms(ctx.cfg)[0])


def _read_features(m: Method, ctx: DraftContext, built: Mapping[str, tuple[torch.nn.Module, Drafter]],
                   dirs: DrafterDirs) -> tuple[int, ...]:
    """The verifier features `m`'s drafter reads: its built drafter's when this process built it,
    else `Method.feature_layers` of its `dirs` entry (its saved config; no module, no weights)."""
    if m.serving in built:
        return built[m.serving][1].feature_layers
    if m.feature_layers is None:  # `register` refuses such a method
        raise ValueError(f"method {m.id!r} ships features but sets no Method.feature_layers")
    path = dirs.get(m.serving)
    return m.feature_layers(ctx, Path(path) if path else None)


def load_serving_models(
    cfg: Config,
    methods: Sequence[str] | None = None,
    drafter_dirs: DrafterDirs | None = None,
    device: torch.device | None = None,
    references: dict[tuple[int, ...], Sequence[int]] | None = None,
) -> ServingModels:
    """Load the verifier once and build the decoders of `methods` (None: every serving name)
    over it, each method's module from its `drafter_dirs` entry; and the verifier features a split
    verifier keeps for every method whose drafter reads them, whichever methods it loads (of one
    it does not load, from `Method.feature_layers`: no drafter is built for it). The
    methods of `serving.synthetic` draft under controlled acceptance; their oracle knows
    `references` ({prompt ids: greedy AR output}) and decodes any other prompt with greedy AR
    when first seen."""
    names = tuple(serving_names() if methods is None else methods)
    unknown = sorted(set(names) - set(serving_names()))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {list(serving_names())}")
    dirs = dict(drafter_dirs or {})
    if cfg.decoding.torch_threads > 0:  # the replica's intra-op threads, as the benchmark's
        torch.set_num_threads(cfg.decoding.torch_threads)
    device = device or resolve_device(cfg.model.device)
    tokenizer = load_tokenizer(cfg)
    verifier = load_verifier(cfg, device)
    eos = eos_token_ids(verifier, tokenizer)
    ctx = DraftContext(cfg, verifier, tokenizer.mask_token_id, tokenizer.pad_token_id)
    drafting = [by_serving(n) for n in names if n != AR]
    built = {m.serving: _build_drafter(m, ctx, dirs.get(m.serving)) for m in drafting}
    wrapping = [m for m in drafting if m.wraps_verifier]
    if len(wrapping) > 1:
        raise ValueError(f"methods {[m.serving for m in wrapping]} each wrap the verifier; serve "
                         "them from separate replicas")
    model = wrapping[0].verifier(built[wrapping[0].serving][0], ctx) if wrapping else verifier
    budget, chunk = cfg.serving.max_tokens_cap, cfg.decoding.prefill_chunk
    profiles = synthetic_profiles(cfg)
    ar = SpeculativeDecoder(model, None, eos, budget, prefill_chunk=chunk)
    oracle = GreedyOracle(lambda prompt, n: ar.decode(prompt, n).tokens, budget, references)
    decoders: dict[str, SpeculativeDecoder] = {}
    for name in names:
        drafter = built[name][1] if name in built else None
        if drafter is not None and name in profiles:
            drafter = ControlledDrafter(drafter, profiles[name], oracle, cfg.decoding.synthetic_seed)
        decoders[name] = SpeculativeDecoder(model, drafter, eos, budget, prefill_chunk=chunk)
    features = {m.serving: _read_features(m, ctx, built, dirs)
                for m in registered() if m.ships == "features"}
    shipped: dict[str, str] = {m.serving: m.ships for m in registered() if m.ships == "features"
                               or (m.ships and cfg.serving.drafter_sync == "ship")}
    return ServingModels(model=model, decoders=decoders, eos_ids=eos, clock=Clock(device),
                         feature_layers=features,
                         shipped=shipped)
