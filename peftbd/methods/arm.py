"""One benchmark arm (`ArmSpec`): a drafting method at one setting, and greedy AR's arm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from peftbd.decoding.controlled import AcceptanceProfile

AR = "ar"
"""Greedy AR's arm id and serving name: the baseline every method is measured against."""


@dataclass(frozen=True)
class ArmSpec:
    """One arm: id, report label, the registered method that drafts (`peftbd.methods`; "ar":
    none), the training stage whose output drafts, and its decoding settings."""

    id: str
    label: str
    method: str
    stage: str | None = None  # the training stage whose artifact drafts (None: AR)
    denoise_steps: int | None = None
    anchored: bool | None = None
    mtp_steps: int | None = None
    draft_layers: int | None = None  # an early-exit arm: its adapter drafts from this many layers
    block_offsets: str | None = None  # PEFT-BD arms: the recipe their adapter was trained with
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


AR_ARM = ArmSpec(AR, "AR (greedy)", AR)
