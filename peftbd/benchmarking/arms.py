"""The benchmark's arms and the models they decode with.

Arms: greedy AR, then every registered drafting method's (`peftbd.methods`, in registration
order: PEFT-BD and its ablations, FastMTP, the heads), last the synthetic arms
(`decoding.synthetic`): drafters whose real drafts are forced to a chosen acceptance
(`peftbd.decoding.controlled`). Each arm drafts with the module its method loads from the output
of the arm's training stage; a method that wraps the verifier (PEFT-BD) gets a copy of its own,
verifying with its adapter off as in the paper, so the wrapper layers never slow the others down.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn
from transformers import PreTrainedModel

from peftbd.config import Config, ConfigError
from peftbd.decoding import Drafter
from peftbd.decoding.controlled import ControlledDrafter, Oracle
from peftbd.methods import AR, AR_ARM, ArmSpec, DraftContext, method, methods
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier, resolve_device


def arm_specs(cfg: Config) -> list[ArmSpec]:
    """Every arm, in report order: AR, each registered method's arms for `cfg`, then the
    synthetic arms."""
    real = [AR_ARM, *(arm for m in methods() for arm in m.arms(cfg))]
    return real + synthetic_specs(cfg, real)


def synthetic_specs(cfg: Config, real: list[ArmSpec]) -> list[ArmSpec]:
    """The controlled-acceptance arms `decoding.synthetic` asks for ("arm=tokens" each: arm id
    "<arm>_synthetic", the arm's drafter at `tokens` accepted tokens per round)."""
    by_id = {s.id: s for s in real if s.method != AR}
    out = []
    for entry in cfg.decoding.synthetic:
        arm, _, tokens = entry.partition("=")
        if arm not in by_id:
            raise ConfigError(f"config key 'decoding.synthetic': entry {entry!r} names no drafting "
                              f"arm of this run; use one of {', '.join(by_id)}")
        spec = by_id[arm]
        positions = spec.mtp_steps or method(spec.method).positions(cfg)
        if not 1.0 <= float(tokens) <= positions + 1:
            raise ConfigError(f"config key 'decoding.synthetic': entry {entry!r} asks for more "
                              f"tokens per round than {arm}'s {positions} draft positions and the "
                              f"bonus can give; use 1 .. {positions + 1}")
        out.append(dataclasses.replace(
            spec, id=f"{arm}_synthetic", label=f"{spec.label} [synthetic: {float(tokens):g}/round]",
            synthetic=float(tokens), positions=positions))
    return out


@dataclass
class ArmModels:
    """Everything a timing worker decodes with, loaded once: the plain verifier (AR's) and, per
    training stage, the draft module its method loaded from that stage's output."""

    verifier: PreTrainedModel
    eos_ids: list[int]
    ctx: DraftContext
    modules: dict[str, nn.Module] = field(default_factory=dict)

    @property
    def mask_id(self) -> int:
        return self.ctx.mask_id

    @property
    def pad_id(self) -> int:
        return self.ctx.pad_id

    @property
    def block_size(self) -> int:
        return self.ctx.cfg.peftbd.block_size

    @property
    def device(self):
        return self.ctx.device

    def module_for(self, spec: ArmSpec) -> nn.Module:
        """The draft module of `spec`'s training stage (a model-free method's: under its id)."""
        key = method(spec.method).module_key(spec)
        if key not in self.modules:
            raise ValueError(f"arm {spec.id!r} drafts with the output of stage {spec.stage!r}, which "
                             f"is not loaded (loaded: {', '.join(self.modules) or 'none'}); pass "
                             "that stage's output dir")
        return self.modules[key]

    def verifier_for(self, spec: ArmSpec) -> nn.Module:
        """The model that verifies for `spec` (PEFT-BD: its adapter's own copy)."""
        if spec.method == AR:
            return self.verifier
        return method(spec.method).verifier(self.module_for(spec), self.ctx)

    def drafter_for(self, spec: ArmSpec, oracle: Oracle | None = None,
                    seed: int = 0) -> Drafter | None:
        """The engine drafter of `spec` (None = greedy AR); a synthetic arm's, its drafter under
        controlled acceptance, which needs the `oracle` (greedy AR's outputs) and a `seed`."""
        profile = spec.profile()
        if profile is not None:
            if oracle is None:
                raise ValueError(f"arm {spec.id!r} is synthetic: it needs an oracle of greedy AR "
                                 "outputs (peftbd.decoding.controlled.reference_oracle)")
            inner = self.drafter_for(dataclasses.replace(spec, synthetic=None))
            assert inner is not None
            return ControlledDrafter(inner, profile, oracle, seed)
        if spec.method == AR:
            return None
        m, module = method(spec.method), self.module_for(spec)
        m.activate(module, spec)
        return m.drafter(module, self.ctx, spec)


@dataclass(frozen=True)
class DrafterDirs:
    """Where the benchmark's drafters lie: {training stage name: output dir}, and the head's
    draft vocabulary (`peftbd.data.draft_vocab`; None: not counted)."""

    stages: dict[str, str]
    draft_vocab: list[int] | None = None


def load_arm_models(cfg: Config, dirs: DrafterDirs) -> ArmModels:
    """The plain verifier and every stage's draft module in `dirs`, on `cfg.model.device` (a
    method that wraps the verifier gets a fresh copy per stage)."""
    device = resolve_device(cfg.model.device)
    tokenizer = load_tokenizer(cfg)
    verifier = load_verifier(cfg, device)
    ctx = DraftContext(cfg, verifier, tokenizer.mask_token_id, tokenizer.pad_token_id,
                       dirs.draft_vocab)
    modules = {m.id: m.load(ctx, None) for m in methods() if not m.trains}
    for m in methods():
        for stage in (s for s in m.stages if s.name in dirs.stages):
            own = dataclasses.replace(ctx, verifier=load_verifier(cfg, device)) if m.wraps_verifier else ctx
            modules[stage.name] = m.load(own, Path(dirs.stages[stage.name]))
    return ArmModels(verifier=verifier, eos_ids=eos_token_ids(verifier, tokenizer), ctx=ctx,
                     modules=modules)
