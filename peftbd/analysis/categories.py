"""Per-category acceptance (Spec-Bench style): per speculative arm and prompt category, tokens per
round (bonus included) with its 95% interval over the category's prompts (`peftbd.intervals`: the
studentized bootstrap) and position-1 acceptance (Table 4's rate at j = 1), and the categories'
equal-weight mix with its interval; the throughput per category beside it, and what the
intervals resolve: which drafters' tokens per round on the equal-weight mix (the pooled prompts
in files without one) are apart (their intervals disjoint) and which are not, and how far the
best drafter's easiest category is from its hardest.

Every number is results.json's (`Arm.mix_accepted_ci95`, `Arm.mean_accepted_ci95`,
`Arm.by_category`: `peftbd.benchmarking.schema.CategoryStats`); the synthetic arms
(`decoding.synthetic`: acceptance set by the run, not measured) are in the tables, not in the
sentences.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from peftbd.analysis.tables import NA, fmt, fmt_ci, fmt_stat, markdown_table
from peftbd.benchmarking.schema import Arm, CategoryStats, Interval, Results
from peftbd.intervals import METHOD

TITLE = "## Per-category acceptance"
MIX_COLUMN = "mix (equal weight)"


def categories(results: Results) -> list[str]:
    """The prompt categories any arm was measured on, sorted (empty: prompts without one)."""
    return sorted({c for _, arm in results.arm_items() for c in arm.by_category})


def _prompts(results: Results, cat: str) -> int | None:
    return next((arm.by_category[cat].prompts for _, arm in results.arm_items()
                 if cat in arm.by_category), None)


def _header(results: Results, cats: Sequence[str]) -> list[str]:
    return ["arm", *[f"{c} ({_prompts(results, c)} prompts)" for c in cats]]


def acceptance_cell(c: CategoryStats | None) -> str | None:
    """`tokens/round (lo-hi), p1 0.xx` of one arm on one category (None: not measured there)."""
    if c is None:
        return None
    p1 = fmt(c.position1_acceptance) or NA
    return f"{fmt_ci(c.mean_accepted.mean, c.mean_accepted_ci95)}, p1 {p1}"


def acceptance_table(results: Results) -> str | None:
    """One row per speculative arm, one column per category: tokens per round with its interval
    over the category's prompts, and position-1 acceptance; a last column, MIX_COLUMN, with the
    categories weighted equally and its interval (when the file has it); None without
    categories."""
    cats = categories(results)
    arms = [arm for _, arm in results.arm_items() if arm.speculative and arm.by_category]
    if not cats or not arms:
        return None
    mix = any(arm.mix_accepted is not None for arm in arms)
    rows = [[arm.label, *[acceptance_cell(arm.by_category.get(c)) for c in cats],
             *([fmt_ci(arm.mix_accepted, arm.mix_accepted_ci95)] if mix else [])]
            for arm in arms]
    return markdown_table([*_header(results, cats), *([MIX_COLUMN] if mix else [])], rows)


def throughput_table(results: Results) -> str | None:
    """One row per arm (AR included), one column per category: batch-1 tok/s (mean ± std over
    the repeats, the mean alone for one); None without categories."""
    cats = categories(results)
    arms = [arm for _, arm in results.arm_items() if arm.by_category]
    if not cats or not arms:
        return None
    rows = []
    for arm in arms:
        stats = [arm.by_category.get(c) for c in cats]
        rows.append([arm.label, *[None if s is None else fmt_stat(s.tokens_per_s, 1,
                                                                 repeats=len(arm.repeats))
                                  for s in stats]])
    return markdown_table(_header(results, cats), rows)


def _drafters(results: Results) -> list[Arm]:
    """The measured drafters: speculative arms but the synthetic ones, in report order."""
    return [arm for _, arm in results.arm_items()
            if arm.speculative and "synthetic" not in arm.settings]


def overlap(a: Interval, b: Interval) -> bool:
    """Whether two intervals share a point (touching counts: not resolved apart)."""
    return a[0] <= b[1] and b[0] <= a[1]


def mix_interval(arm: Arm) -> Interval | None:
    """The arm's interval of tokens per round on the whole prompt mix: the equal-weight mix's
    where the file has the mix (None: a category under 2 prompts), else the pooled prompts'
    (`mean_accepted_ci95`)."""
    return arm.mean_accepted_ci95 if arm.mix_accepted is None else arm.mix_accepted_ci95


def resolution(results: Results) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(resolved apart, not resolved): the pairs of drafters (labels, report order) whose 95%
    intervals of tokens per round over the whole prompt mix (`mix_interval`) are disjoint, and
    those whose intervals overlap. Drafters without an interval (under 2 prompts) are in
    neither."""
    arms = [(arm.label, ci) for arm in _drafters(results) if (ci := mix_interval(arm))]
    apart: list[tuple[str, str]] = []
    together: list[tuple[str, str]] = []
    for (la, a), (lb, b) in combinations(arms, 2):
        (together if overlap(a, b) else apart).append((la, lb))
    return apart, together


def _pairs(pairs: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{a} vs {b}" for a, b in pairs) or "none"


def resolution_sentence(results: Results) -> str:
    """Which drafters the acceptance intervals on the whole prompt mix resolve apart, which not."""
    apart, together = resolution(results)
    if not apart and not together:
        return ("Fewer than two drafters have a 95% interval of tokens per round (each needs 2 "
                "prompts or more): nothing to resolve apart.")
    mix = ("the equal-weight mix of the categories" if any(
        arm.mix_accepted is not None for arm in _drafters(results)) else "the whole prompt mix")
    return (f"On {mix}, resolved apart (95% intervals of tokens per round "
            f"disjoint): {_pairs(apart)}; the other {len(together)} pair(s) of drafters overlap.")


def spread_sentence(results: Results) -> str | None:
    """The best drafter's (most tokens per round on the whole mix) easiest vs hardest category:
    both with their intervals and the ratio; None without a drafter on 2 categories."""
    arms = [arm for arm in _drafters(results) if len(arm.by_category) >= 2]
    if not arms:
        return None
    best = max(arms, key=lambda arm: arm.mean_accepted.mean)
    ranked = sorted(best.by_category.items(), key=lambda kv: kv[1].mean_accepted.mean)
    (hard, h), (easy, e) = ranked[0], ranked[-1]
    ratio = e.mean_accepted.mean / h.mean_accepted.mean
    if e.mean_accepted_ci95 and h.mean_accepted_ci95:
        together = overlap(e.mean_accepted_ci95, h.mean_accepted_ci95)
        verdict = "; their intervals overlap" if together else "; their intervals are disjoint"
    else:
        verdict = ""
    return (f"Best drafter by tokens per round, {best.label} "
            f"({fmt_ci(best.mean_accepted.mean, best.mean_accepted_ci95)}): easiest category "
            f"{easy} at {fmt_ci(e.mean_accepted.mean, e.mean_accepted_ci95)} vs hardest {hard} "
            f"at {fmt_ci(h.mean_accepted.mean, h.mean_accepted_ci95)}, {ratio:.2f}x{verdict}.")


def section(results: Results) -> list[str]:
    """The report's per-category section (nothing when the prompts have no categories)."""
    table = acceptance_table(results)
    if table is None:
        return []
    return [
        TITLE,
        "Per speculative arm and prompt category: accepted tokens per round (bonus included) "
        f"with its 95% interval over the category's prompts ({METHOD}, repeats pooled), and "
        "p1 = position-1 acceptance, the share of drafting rounds whose first draft token was "
        f"accepted (Table 4's rate at j = 1). The last column, {MIX_COLUMN}, weighs each "
        "category equally: the mean of the categories' tokens per round, with its 95% interval "
        f"({METHOD}, prompts resampled within their category); which drafters are resolved "
        "apart below is read from it.",
        table,
        "Throughput per category (tok/s, batch 1):",
        *filter(None, [throughput_table(results)]),
        "\n".join(f"- {line}" for line in
                  filter(None, [resolution_sentence(results), spread_sentence(results)])),
    ]
