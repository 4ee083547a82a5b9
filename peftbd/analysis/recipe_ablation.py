"""The DFlash recipe ablation (`jobs.recipe_ablation`): what each of DFlash's six recipe changes
buys in accepted tokens per round, measured leave-one-out: DFlash trained again with that one
change reverted to today's head recipe, everything else (data, steps, optimizer, layers) equal.

Tokens per round are 1 + the training eval's `eval_accepted_prefix_mean`: the engine's rounds
replayed on the val rows (`peftbd.training.rounds`; the benchmark's Table 6 shows the engine
matches its replay up to float noise), so every variant is measured on the same rows and budget.

Noise: each run's final eval has a 95% interval over the val rows (`eval_accepted_prefix_ci95`,
the ratio accepted / rounds with rows independent); a difference from full DFlash is "resolved" only when it exceeds the combined
interval, sqrt(h_DFlash² + h_row²) of the two runs' half-widths, and "within noise" otherwise.
The two runs' intervals are treated as independent (they score the same val rows, so the
combined width is, if anything, wide: a "resolved" is conservative).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

from peftbd.config_sections import HeadConfig

CHANGES: dict[str, tuple[str, str]] = {
    "feature_rule": ("feature layers", "one per head layer, spaced 1..L-3 (vs 3 spread)"),
    "block_masks": ("block", "[last token, D-1 masks] (vs [last token, D masks])"),
    "loss_decay": ("loss weights", "exp(-(k-1)/gamma) (vs the linear-prefix discount)"),
    "anchors": ("anchors", "up to N random per row (vs a block every block_stride)"),
    "anchor_fusion": ("plain first token", "its embedding alone (vs fused with its predecessor's context)"),
    "anchored": ("non-causal block", "the first token sees the masks (vs the cache and itself)"),
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


RESOLVED, WITHIN_NOISE = "resolved", "within noise"


@dataclass(frozen=True)
class AblationRow:
    """One trained variant: its name, the change it reverts (None: a full recipe), its tokens per
    round (offline replay, bonus included), the drop against full DFlash, the half-width of its
    final 95% interval, the combined half-width of the difference (sqrt of the sum of the two
    runs' squared half-widths) and whether the difference is `RESOLVED` or `WITHIN_NOISE`
    (None: no difference or no interval to judge it by)."""

    variant: str
    reverted: str | None
    tokens_per_round: float | None
    buys: float | None = None  # full DFlash's tokens per round minus this variant's
    half_width: float | None = None
    noise: float | None = None
    verdict: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tokens_per_round(manifest: dict[str, Any]) -> float | None:
    """1 + a training run's offline accepted prefix (None: not evaluated)."""
    prefix = manifest.get("metrics", {}).get("eval_accepted_prefix_mean")
    return None if prefix is None else 1.0 + float(prefix)


def interval_half_width(manifest: dict[str, Any]) -> float | None:
    """Half the width of a training run's final 95% interval of the accepted prefix (the same in
    tokens per round: the bonus is a constant); None: no interval."""
    ci = manifest.get("metrics", {}).get("eval_accepted_prefix_ci95")
    return None if ci is None else (float(ci[1]) - float(ci[0])) / 2


def judged(base: float | None, h_base: float | None, tpr: float | None,
           h: float | None) -> tuple[float | None, float | None, str | None]:
    """(difference base - tpr, combined half-width, verdict) of one run against full DFlash."""
    diff = None if base is None or tpr is None else base - tpr
    noise = None if h_base is None or h is None else math.hypot(h_base, h)
    if diff is None or noise is None:
        return diff, noise, None
    return diff, noise, RESOLVED if abs(diff) > noise else WITHIN_NOISE


def ablation_rows(full: dict[str, Any], head: dict[str, Any] | None,
                  variants: dict[str, dict[str, Any]]) -> list[AblationRow]:
    """Rows: full DFlash, each leave-one-out variant ({reverted field: its training manifest})
    with what that change buys, and today's head (when its manifest is given: what all four
    buy together), each difference judged against the combined interval."""
    base, h_base = tokens_per_round(full), interval_half_width(full)
    rows = [AblationRow("DFlash (all four changes)", None, base, half_width=h_base)]
    named: list[tuple[str, str | None, dict[str, Any]]] = [
        (f"DFlash without its {CHANGES[field][0]}", field, manifest)
        for field, manifest in variants.items()]
    if head is not None:
        named.append(("today's head (none of them)", None, head))
    for variant, field, manifest in named:
        tpr, h = tokens_per_round(manifest), interval_half_width(manifest)
        buys, noise, verdict = judged(base, h_base, tpr, h)
        rows.append(AblationRow(variant, field, tpr, buys, h, noise, verdict))
    return rows


def _num(value: float | None, signed: bool = False) -> str:
    return "n/a" if value is None else (f"{value:+.2f}" if signed else f"{value:.2f}")


def _half(value: float | None) -> str:
    return "n/a" if value is None else f"±{value:.2f}"


def ablation_markdown(rows: list[AblationRow]) -> str:
    """The ablation as a markdown table, one line per variant: tokens per round with its final
    interval's half-width, the difference from DFlash with the combined half-width, and the
    verdict."""
    lines = ["| variant | reverted to the head's | tokens / round (offline) | the change buys "
             "| vs noise |",
             "|---|---|---|---|---|"]
    for r in rows:
        change = "" if r.reverted is None else f"{r.reverted}: {CHANGES[r.reverted][1]}"
        tpr = _num(r.tokens_per_round) + ("" if r.half_width is None else f" {_half(r.half_width)}")
        buys = _num(r.buys, True) + ("" if r.noise is None else f" (noise {_half(r.noise)})")
        verdict = "" if r.buys is None else (r.verdict or "n/a (no interval)")
        lines.append(f"| {r.variant} | {change} | {tpr} | {buys} | {verdict} |")
    return "\n".join(lines)


def ablation_section(manifest: dict[str, Any] | None, subdir: str) -> list[str]:
    """The report's summary of the ablation beside this run (its manifest records the rows)."""
    if not manifest:
        return []
    rows = [AblationRow(**r) for r in manifest.get("rows", [])]
    return ["## DFlash recipe ablation",
            f"From the ablation beside this run (`{subdir}/ablation.md`): DFlash trained with one "
            "recipe change reverted at a time, same data, steps and layers; tokens per round from "
            "the engine's rounds replayed on the val rows (bonus included), ± the half-width of "
            "the run's final 95% interval over the val rows. A difference from DFlash is "
            "\"resolved\" only when it exceeds the combined interval (noise: the square root of "
            "the sum of the two runs' squared half-widths), \"within noise\" otherwise.",
            ablation_markdown(rows)]
