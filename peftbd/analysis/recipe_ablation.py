"""The DFlash recipe ablation (`jobs.recipe_ablation`): what each of DFlash's four recipe changes
buys in accepted tokens per round, measured leave-one-out: DFlash trained again with that one
change reverted to today's head recipe, everything else (data, steps, optimizer, layers) equal.

Tokens per round are 1 + the training eval's `eval_accepted_prefix_mean`: the engine's rounds
replayed on the val rows (`peftbd.training.rounds`; the benchmark's Table 6 shows the engine
matches its replay up to float noise), so every variant is measured on the same rows and budget.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from peftbd.config_sections import HeadConfig

CHANGES: dict[str, tuple[str, str]] = {
    "feature_rule": ("feature layers", "one per head layer, spaced 1..L-3 (vs 3 spread)"),
    "block_masks": ("block", "[last token, D-1 masks] (vs [last token, D masks])"),
    "loss_decay": ("loss weights", "exp(-(k-1)/gamma) (vs the linear-prefix discount)"),
    "anchors": ("anchors", "up to N random per row (vs a block every block_stride)"),
}
"""HeadConfig field -> (what it changes, DFlash's choice vs today's head)."""


def reverted(dflash: HeadConfig, head: HeadConfig, field: str) -> HeadConfig:
    """`dflash` with `field` set to `head`'s value (the rest of DFlash's recipe kept)."""
    if field not in CHANGES:
        raise ValueError(f"{field!r} is not a DFlash recipe change; use one of {', '.join(CHANGES)}")
    return dataclasses.replace(dflash, **{field: getattr(head, field)})


def differing(dflash: HeadConfig, head: HeadConfig) -> list[str]:
    """The recipe changes where `dflash` and `head` differ (only those can be ablated)."""
    return [f for f in CHANGES if getattr(dflash, f) != getattr(head, f)]


@dataclass(frozen=True)
class AblationRow:
    """One trained variant: its name, the change it reverts (None: a full recipe), its tokens per
    round (offline replay, bonus included) and the drop against full DFlash."""

    variant: str
    reverted: str | None
    tokens_per_round: float | None
    buys: float | None = None  # full DFlash's tokens per round minus this variant's

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tokens_per_round(manifest: dict[str, Any]) -> float | None:
    """1 + a training run's offline accepted prefix (None: not evaluated)."""
    prefix = manifest.get("metrics", {}).get("eval_accepted_prefix_mean")
    return None if prefix is None else 1.0 + float(prefix)


def ablation_rows(full: dict[str, Any], head: dict[str, Any] | None,
                  variants: dict[str, dict[str, Any]]) -> list[AblationRow]:
    """Rows: full DFlash, each leave-one-out variant ({reverted field: its training manifest})
    with what that change buys, and today's head (when its manifest is given)."""
    base = tokens_per_round(full)
    rows = [AblationRow("DFlash (all four changes)", None, base)]
    for field, manifest in variants.items():
        tpr = tokens_per_round(manifest)
        rows.append(AblationRow(f"DFlash without its {CHANGES[field][0]}", field, tpr,
                                None if base is None or tpr is None else base - tpr))
    if head is not None:
        rows.append(AblationRow("today's head (none of them)", None, tokens_per_round(head)))
    return rows


def _num(value: float | None, signed: bool = False) -> str:
    return "n/a" if value is None else (f"{value:+.3f}" if signed else f"{value:.3f}")


def ablation_markdown(rows: list[AblationRow]) -> str:
    """The ablation as a markdown table, one line per variant."""
    lines = ["| variant | reverted to the head's | tokens / round (offline) | the change buys |",
             "|---|---|---|---|"]
    for r in rows:
        change = "" if r.reverted is None else f"{r.reverted}: {CHANGES[r.reverted][1]}"
        lines.append(f"| {r.variant} | {change} | {_num(r.tokens_per_round)} | {_num(r.buys, True)} |")
    return "\n".join(lines)


def ablation_section(manifest: dict[str, Any] | None, subdir: str) -> list[str]:
    """The report's summary of the ablation beside this run (its manifest records the rows)."""
    if not manifest:
        return []
    rows = [AblationRow(**r) for r in manifest.get("rows", [])]
    return ["## DFlash recipe ablation",
            f"From the ablation beside this run (`{subdir}/ablation.md`): DFlash trained with one "
            "recipe change reverted at a time, same data, steps and layers; tokens per round from "
            "the engine's rounds replayed on the val rows (bonus included).",
            ablation_markdown(rows)]
