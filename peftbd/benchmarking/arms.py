"""The benchmark's arms and the models they decode with.

Arms (ids from `peftbd.benchmarking.schema.ARMS`): greedy AR; PEFT-BD with one denoising step,
unanchored (the paper's main setting); its two ablations, two denoising steps and anchored; beyond
the paper, early-exit PEFT-BD (`drafter.early_exit_layers = k`: its own adapter drafts from the
first k layers; `peftbd.models.early_exit`) and the block-offsets ablation
(`drafter.offsets_ablation`: an adapter trained with the other `drafter.block_offsets` recipe);
FastMTP, and the block-diffusion head (`peftbd.models.bd_head`, beyond the paper: its own layers
draft a block from the verifier's features), with the whole vocabulary and, when `head.draft_vocab`
> 0, over the artifact's N most frequent tokens (FR-Spec); last, the synthetic arms
(`decoding.synthetic`): drafters whose real drafts are forced to a chosen acceptance
(`peftbd.decoding.controlled`). AR, FastMTP and the head run on the
plain verifier; each PEFT-BD adapter on its own copy of it (verifying with the adapter off, as in
the paper), so the adapter's wrapper layers never slow the baselines down. A PEFT-BD arm names
its adapter by the training stage that made it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from peftbd.config import Config, ConfigError
from peftbd.decoding import BDHeadDrafter, Drafter, MTPDrafter, PeftBDDrafter
from peftbd.decoding.controlled import AcceptanceProfile, ControlledDrafter, Oracle
from peftbd.layout import OTHER_OFFSETS, TRAIN_EARLY_EXIT, TRAIN_OFFSETS, TRAIN_PEFTBD
from peftbd.models.bd_head import BDHead
from peftbd.models.early_exit import adapter_depth
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier, resolve_device
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import load_drafter_adapter


@dataclass(frozen=True)
class ArmSpec:
    """One arm: id, report label, method (ar | peftbd | fastmtp | peftbd_head) and its decoding
    settings."""

    id: str
    label: str
    method: str
    denoise_steps: int | None = None
    anchored: bool | None = None
    mtp_steps: int | None = None
    draft_layers: int | None = None  # an early-exit arm: its adapter drafts from this many layers
    block_offsets: str | None = None  # PEFT-BD arms: the recipe their adapter was trained with
    adapter: str | None = None  # PEFT-BD arms: the training stage whose adapter drafts
    draft_vocab: int | None = None  # head arms: tokens the draft LM head scores (None: all)
    synthetic: float | None = None
    """Controlled acceptance (`peftbd.decoding.controlled`): the drafter's real drafts forced to
    this many tokens per round on average; None: the drafter's own acceptance."""
    positions: int | None = None  # draft positions per round (for the synthetic profile)

    def settings(self) -> dict[str, Any]:
        """The non-empty decoding settings, for results.json."""
        keys = ("denoise_steps", "anchored", "mtp_steps", "draft_layers", "block_offsets",
                "draft_vocab", "synthetic")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}

    def profile(self) -> AcceptanceProfile | None:
        """The synthetic arm's acceptance profile (None for an arm with its own acceptance)."""
        if self.synthetic is None or self.positions is None:
            return None
        return AcceptanceProfile.with_mean(self.synthetic, self.positions)


def arm_specs(cfg: Config) -> list[ArmSpec]:
    """Every arm, in report order, with block size, MTP steps, the early-exit depth (no arm when
    `drafter.early_exit_layers` is 0), the offsets ablation (unless `drafter.offsets_ablation`
    is off) and the head's draft vocabulary (no arm when `head.draft_vocab` is 0) from `cfg`."""
    d, k, exit_k = cfg.drafter.block_size, cfg.mtp.num_steps, cfg.drafter.early_exit_layers
    layers, n = cfg.head.layers, cfg.head.draft_vocab
    offsets, other = cfg.drafter.block_offsets, OTHER_OFFSETS[cfg.drafter.block_offsets]

    def peftbd(id_: str, label: str, steps: int = 1, anchored: bool = False,
               adapter: str = TRAIN_PEFTBD.name, **settings: Any) -> ArmSpec:
        return ArmSpec(id_, f"PEFT-BD D={d}, {label}", "peftbd", denoise_steps=steps,
                       anchored=anchored, adapter=adapter, **{"block_offsets": offsets, **settings})

    real = [
        ArmSpec("ar", "AR (greedy)", "ar"),
        peftbd("peftbd", "1 step"),
        peftbd("peftbd_2step", "2 steps", steps=2),
        peftbd("peftbd_anchored", "1 step, anchored", anchored=True),
        *([peftbd("peftbd_early_exit", f"1 step, first {exit_k} layer{'s' * (exit_k != 1)}",
                  draft_layers=exit_k,
                  adapter=TRAIN_EARLY_EXIT.name)] if exit_k > 0 else []),
        *([peftbd("peftbd_offsets", f"1 step, {other} offsets", block_offsets=other,
                  adapter=TRAIN_OFFSETS.name)] if cfg.drafter.offsets_ablation else []),
        ArmSpec("fastmtp", f"FastMTP ({k} steps)", "fastmtp", mtp_steps=k),
        ArmSpec("peftbd_head", f"BD head D={d}, {layers} layer{'s' * (layers != 1)}", "peftbd_head"),
        *([ArmSpec("peftbd_head_vocab", f"BD head D={d}, top-{n} draft vocab", "peftbd_head",
                   draft_vocab=n)] if n > 0 else []),
    ]
    return real + synthetic_specs(cfg, real)


def synthetic_specs(cfg: Config, real: list[ArmSpec]) -> list[ArmSpec]:
    """The controlled-acceptance arms `decoding.synthetic` asks for ("arm=tokens" each: arm id
    "<arm>_synthetic", the arm's drafter at `tokens` accepted tokens per round)."""
    by_id = {s.id: s for s in real if s.method != "ar"}
    out = []
    for entry in cfg.decoding.synthetic:
        arm, _, tokens = entry.partition("=")
        if arm not in by_id:
            raise ConfigError(f"config key 'decoding.synthetic': entry {entry!r} names no drafting "
                              f"arm of this run; use one of {', '.join(by_id)}")
        spec = by_id[arm]
        positions = spec.mtp_steps if spec.method == "fastmtp" else cfg.drafter.block_size
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
    """Everything a timing worker decodes with, loaded once."""

    verifier: PreTrainedModel  # plain: AR, FastMTP and the head
    mtp_head: MTPHead
    eos_ids: list[int]
    mask_id: int
    pad_id: int
    block_size: int
    device: torch.device
    adapters: dict[str, torch.nn.Module] = field(default_factory=dict)
    """{training stage name: a copy of the verifier carrying that stage's adapter}."""
    bd_head: BDHead | None = None
    draft_vocab: list[int] | None = None
    """The head's draft vocabulary, most frequent first; an arm uses its first `draft_vocab`."""

    def verifier_for(self, spec: ArmSpec) -> torch.nn.Module:
        """The model that verifies for `spec` (its adapter's own copy for PEFT-BD arms)."""
        if spec.method != "peftbd":
            return self.verifier
        if spec.adapter not in self.adapters:
            raise ValueError(f"arm {spec.id!r} drafts with the adapter of stage {spec.adapter!r}; "
                             f"loaded: {', '.join(self.adapters) or 'none'}")
        return self.adapters[spec.adapter]

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
            return ControlledDrafter(inner, profile, oracle, seed)
        if spec.method == "ar":
            return None
        if spec.method == "peftbd":
            return PeftBDDrafter(self.verifier_for(spec), self.mask_id, self.block_size,
                                 denoise_steps=spec.denoise_steps or 1,
                                 anchored=bool(spec.anchored))
        if spec.method == "fastmtp":
            return MTPDrafter(self.mtp_head, self.verifier, num_steps=spec.mtp_steps or 1)
        if spec.method == "peftbd_head":
            return self._head_drafter(spec)
        raise ValueError(f"arm {spec.id!r}: unknown method {spec.method!r}; use ar, peftbd, "
                         "fastmtp or peftbd_head")

    def _head_drafter(self, spec: ArmSpec) -> BDHeadDrafter:
        if self.bd_head is None:
            raise ValueError(f"arm {spec.id!r} drafts with the block-diffusion head, which is not "
                             "loaded: pass the train_head output dir")
        vocab = None
        if spec.draft_vocab:
            if not self.draft_vocab or len(self.draft_vocab) < spec.draft_vocab:
                raise ValueError(f"arm {spec.id!r} drafts over {spec.draft_vocab} tokens but the "
                                 f"loaded draft vocabulary has {len(self.draft_vocab or [])}")
            vocab = torch.tensor(self.draft_vocab[: spec.draft_vocab])
        return BDHeadDrafter(self.bd_head, self.verifier, self.block_size, vocab_ids=vocab)


@dataclass(frozen=True)
class DrafterDirs:
    """Where the benchmark's drafters lie: {training stage name: output dir} of the PEFT-BD
    adapters, the MTP head's and the block-diffusion head's output dirs (None: no head arms),
    and the head's draft vocabulary (`peftbd.data.draft_vocab`; None: no vocabulary arm)."""

    adapters: dict[str, str]
    mtp_head: str
    bd_head: str | None = None
    draft_vocab: list[int] | None = None


def load_arm_models(cfg: Config, dirs: DrafterDirs) -> ArmModels:
    """The plain verifier, one copy per PEFT-BD adapter, the MTP head and the block-diffusion
    head (when `dirs.bd_head`), on `cfg.model.device`."""
    device = resolve_device(cfg.model.device)
    tokenizer = load_tokenizer(cfg)
    verifier = load_verifier(cfg, device)
    adapters = {name: load_drafter_adapter(load_verifier(cfg, device), path).eval()
                for name, path in dirs.adapters.items()}
    early_exit = adapters.get(TRAIN_EARLY_EXIT.name)
    if early_exit is not None and adapter_depth(early_exit) != cfg.drafter.early_exit_layers:
        raise ValueError(
            f"the early-exit adapter in {str(dirs.adapters[TRAIN_EARLY_EXIT.name])!r} drafts from "
            f"{adapter_depth(early_exit)} layers but drafter.early_exit_layers="
            f"{cfg.drafter.early_exit_layers}; set it to match or retrain the adapter"
        )
    bd_head = None if dirs.bd_head is None else BDHead.from_pretrained(dirs.bd_head, verifier).eval()
    return ArmModels(
        verifier=verifier, mtp_head=MTPHead.from_pretrained(dirs.mtp_head, verifier).eval(),
        eos_ids=eos_token_ids(verifier, tokenizer), mask_id=tokenizer.mask_token_id,
        pad_id=tokenizer.pad_token_id,
        block_size=cfg.drafter.block_size, device=device, adapters=adapters, bd_head=bd_head,
        draft_vocab=dirs.draft_vocab,
    )
