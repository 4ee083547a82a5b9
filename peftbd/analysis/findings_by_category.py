"""The paper's findings judged per category of prompts: which of them hold whatever the content,
and which depend on the world (their verdict differs between categories).

Each category's view of the run gives every arm that category's accepted tokens per round and
tok/s (`Arm.by_category`) and no oracle (it is fitted to the whole mix), so (c) and (f), which
rest on the oracle, are judged on the whole mix only.
"""

from __future__ import annotations

from peftbd.analysis.findings import NOT_MEASURABLE, REPRODUCED, Finding, findings
from peftbd.benchmarking.schema import Results, Throughput

MIX = "all prompts"


def category_view(results: Results, category: str) -> Results:
    """`results` as if its prompts were only `category`'s (arms without it are left out)."""
    arms = {}
    for arm_id, arm in results.arms.items():
        cat = arm.by_category.get(category)
        if cat is not None:
            arms[arm_id] = arm.model_copy(update={
                "mean_accepted": cat.mean_accepted, "oracle": None,
                "tokens_per_s": Throughput(mean=cat.tokens_per_s.mean, std=cat.tokens_per_s.std)})
    return results.model_copy(update={"arms": arms})


def _mark(finding: Finding) -> str:
    if finding.verdict == NOT_MEASURABLE:
        return "-"
    return "holds" if finding.verdict == REPRODUCED else "**not**"


def findings_by_category(results: Results) -> str | None:
    """A table of findings x (all prompts, each category) and which findings depend on the
    content; None when the prompts have no categories."""
    cats = sorted({c for arm in results.arms.values() for c in arm.by_category})
    if not cats:
        return None
    columns = {MIX: findings(results), **{c: findings(category_view(results, c)) for c in cats}}
    keys = [f.key for f in columns[MIX]]
    rows = [f"| ({k}) | " + " | ".join(_mark(columns[c][i]) for c in columns) + " |"
            for i, k in enumerate(keys)]
    depends: list[str] = []
    alike: list[str] = []
    for i, k in enumerate(keys):
        verdicts = {columns[c][i].verdict for c in cats} - {NOT_MEASURABLE}
        if not verdicts:
            continue
        (depends if len(verdicts) > 1 else alike).append(f"({k})")
    return "\n".join([
        "| finding | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns), *rows, "",
        f"Depends on the content (its verdict differs between categories): "
        f"{', '.join(depends) or 'none'}; the same in every category: {', '.join(alike) or 'none'}. "
        "(c) and (f) rest on the draft-cost oracle, fitted to all prompts: judged there only.",
    ])


def section(results: Results) -> list[str]:
    """The report's per-category findings (nothing when the prompts have no categories)."""
    table = findings_by_category(results)
    if table is None:
        return []
    return ["## Findings per category: which depend on the world",
            "Each finding judged again on each category's prompts alone (holds / **not** / - for "
            "not measurable there).", table]
