"""The acceptance study's report: its variants, each drafter's tokens per round per variant and
category with 95% intervals, the effect of each suspect, and the factor that decides (study.md,
study.png)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from peftbd.benchmarking.acceptance_study import MIX, Cell, Study
from peftbd.intervals import METHOD


def _cell(c: Cell | None, p1: bool = False) -> str:
    if c is None:
        return "-"
    text = f"{c.tokens_per_round:.2f} ({c.ci95[0]:.2f}-{c.ci95[1]:.2f})"
    return f"{text}, p1 {c.position1:.2f}" if p1 else text


def _half(c: Cell) -> float:
    return (c.ci95[1] - c.ci95[0]) / 2


@dataclass(frozen=True)
class Effect:
    """What one factor moves one arm's tokens per round by: `delta` (the variant's mix minus the
    base's, or the easiest category's minus the hardest's), whether it exceeds the two
    intervals combined (`resolved`), and which variant or categories."""

    arm: str
    factor: str
    delta: float
    resolved: bool
    where: str


def _delta(arm: str, factor: str, a: Cell, b: Cell, where: str) -> Effect:
    delta = a.tokens_per_round - b.tokens_per_round
    return Effect(arm, factor, round(delta, 3), abs(delta) > math.hypot(_half(a), _half(b)), where)


def effects(study: Study) -> list[Effect]:
    """Per arm: each varied factor's largest move against the base, and content (the base's
    easiest category against its hardest)."""
    out = []
    for arm in _arms(study):
        base = study.get("base", arm)
        if base is None:
            continue
        for factor in ("depth", "budget"):
            moved = [(c, f.variant.name) for f in study.variants if f.variant.factor == factor
                     for c in [study.get(f.variant.name, arm)] if c is not None]
            if moved:
                c, name = max(moved, key=lambda m: abs(m[0].tokens_per_round - base.tokens_per_round))
                out.append(_delta(arm, factor, c, base, name))
        cats = [c for c in study.cells if c.variant == "base" and c.arm == arm and c.category != MIX]
        if len(cats) > 1:
            hi, lo = max(cats, key=lambda c: c.tokens_per_round), min(cats, key=lambda c: c.tokens_per_round)
            out.append(_delta(arm, "content", hi, lo, f"{hi.category} vs {lo.category}"))
    return out


def _arms(study: Study) -> list[str]:
    return list(dict.fromkeys(c.arm for c in study.cells))


def deciding_paragraph(study: Study) -> str:
    """Which factor moves acceptance most, in numbers, per arm and over all arms."""
    found = effects(study)
    if not found:
        return "No drafter was replayed: nothing to decide."
    lines = []
    for arm in _arms(study):
        mine = sorted((e for e in found if e.arm == arm), key=lambda e: -abs(e.delta))
        if mine:
            lines.append(f"{arm}: " + "; ".join(
                f"{e.factor} {e.delta:+.2f} ({e.where}, {'resolved' if e.resolved else 'within noise'})"
                for e in mine))
    by_factor: dict[str, list[float]] = {}
    for e in found:
        by_factor.setdefault(e.factor, []).append(abs(e.delta))
    means = {f: sum(v) / len(v) for f, v in by_factor.items()}
    top = max(means, key=lambda f: means[f])
    ranked = ", ".join(f"{f} {means[f]:.2f}" for f in sorted(means, key=lambda f: -means[f]))
    return (f"**The deciding factor is {top}**: mean move in tokens per round over the drafters "
            f"{ranked}. Per drafter (largest first; a move is resolved when it exceeds the two "
            "95% intervals combined):\n\n" + "\n".join(f"- {line}" for line in lines))


def mix_table(study: Study) -> str:
    """Each drafter's tokens per round on the held-out mix, a column per variant."""
    names = [f.variant.name for f in study.variants]
    rows = [f"| {a} | " + " | ".join(_cell(study.get(n, a)) for n in names) + " |"
            for a in _arms(study)]
    return "\n".join(["| arm | " + " | ".join(names) + " |", "|---|" + "---|" * len(names), *rows])


def category_table(study: Study) -> str:
    """Each variant's drafters per category: tokens per round and position-1 acceptance."""
    cats = sorted({c.category for c in study.cells if c.category != MIX})
    rows = [f"| {f.variant.name} | {a} | " + " | ".join(
        _cell(study.get(f.variant.name, a, c), p1=True) for c in cats) + " |"
        for f in study.variants for a in _arms(study) if study.get(f.variant.name, a)]
    return "\n".join(["| variant | arm | " + " | ".join(cats) + " |",
                      "|---|---|" + "---|" * len(cats), *rows])


def variants_table(study: Study) -> str:
    """What each variant trained: its verifier and its drafters' steps."""
    rows = [f"| {f.variant.name} | {f.variant.factor} | {f.layers} x {f.hidden_size} | "
            f"{f.parameters:,} | {f.world_steps} | {f.heldout_loss:.3f} | "
            + ", ".join(f"{k} {v}" for k, v in f.drafter_steps.items()) + " |"
            for f in study.variants]
    return "\n".join(["| variant | varies | verifier layers x hidden | parameters | world steps "
                      "| held-out loss (nats) | drafter steps |", "|---|---|---|---|---|---|---|", *rows])


HOW = ("Tokens per round (accepted draft tokens + the bonus) of each drafter's greedy rounds "
       f"replayed on the held-out val + test rows at the artifact's budget, with 95% intervals "
       f"over rows ({METHOD}); p1: position-1 acceptance.")


def study_markdown(study: Study) -> str:
    """study.md: the variants, acceptance per variant (mix) and per category, the effects."""
    return "\n\n".join(["# Acceptance study", HOW, "## Variants", variants_table(study),
                         "## Tokens per round on the held-out mix", mix_table(study),
                         "## Per category", category_table(study), "## What decides acceptance",
                         deciding_paragraph(study)]) + "\n"


def study_section(manifest: dict | None, subdir: str) -> list[str]:
    """The report's summary of the study beside the run (its manifest records the tables)."""
    if not manifest:
        return []
    return ["## What decides acceptance (the acceptance study)",
            f"From the acceptance study beside this run (`{subdir}/study.md`, `study.png`). {HOW}",
            manifest["mix_table"], manifest["deciding"]]


def study_figure(study: Study, path: Path) -> None:
    """study.png: one panel per drafter, tokens per round per variant, a bar per category (and
    the mix) with its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms, names = _arms(study), [f.variant.name for f in study.variants]
    cats = [MIX, *sorted({c.category for c in study.cells if c.category != MIX})]
    fig, axes = plt.subplots(1, max(1, len(arms)), figsize=(4.2 * max(1, len(arms)), 3.8),
                             sharey=True, squeeze=False)
    width = 0.8 / len(cats)
    for ax, arm in zip(axes[0], arms):
        for j, cat in enumerate(cats):
            xs, ys, errs = [], [], []
            for i, name in enumerate(names):
                c = study.get(name, arm, cat)
                if c is not None:
                    xs.append(i + (j - (len(cats) - 1) / 2) * width)
                    ys.append(c.tokens_per_round)
                    errs.append([[c.tokens_per_round - c.ci95[0]], [c.ci95[1] - c.tokens_per_round]])
            if xs:
                yerr = [[e[0][0] for e in errs], [e[1][0] for e in errs]]
                ax.bar(xs, ys, width, yerr=yerr, capsize=2, label=cat)
        ax.set_title(arm, fontsize=10)
        ax.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
        ax.axhline(1.0, color="grey", lw=0.5)
    axes[0][0].set_ylabel("tokens per round (replay)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
