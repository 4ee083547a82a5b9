"""The concurrency sweep in the report: aggregate tok/s and speedup vs AR per arm and batch
size (Table 8), where each speculative arm's speedup crosses 1.0 as the batch grows, and the
engine's goal (AR at batch 16 >= 8x its batch-1 aggregate tok/s), all computed from
results.json `concurrency`."""

from __future__ import annotations

from collections.abc import Sequence

from peftbd.analysis.head_goals import Goal
from peftbd.analysis.tables import fmt, markdown_table
from peftbd.benchmarking.schema import ConcurrencyRow, Results
from peftbd.methods.arm import AR

ENGINE_GOAL_BATCH, ENGINE_GOAL_RATIO = 16, 8.0
"""AR's aggregate tok/s at ENGINE_GOAL_BATCH must be >= ENGINE_GOAL_RATIO x its batch-1 tok/s."""
NO_SWEEP = "_No concurrency sweep in this run (results.json has no `concurrency` rows)._"


def _by_arm(results: Results) -> list[tuple[str, str, list[ConcurrencyRow]]]:
    """(arm id, label, its rows by increasing batch size) in report order, arms with rows only."""
    out = []
    for arm_id, arm in results.arm_items():
        mine = sorted((r for r in results.concurrency if r.arm == arm_id),
                      key=lambda r: r.batch_size)
        if mine:
            out.append((arm_id, arm.label, mine))
    return out


def batch_sizes(results: Results) -> list[int]:
    """Every batch size of the sweep, increasing."""
    return sorted({r.batch_size for r in results.concurrency})


def _ar_tokens_per_s(results: Results) -> dict[int, float]:
    """{batch size: AR's aggregate tok/s}."""
    return {r.batch_size: r.tokens_per_s for r in results.concurrency if r.arm == AR}


def concurrency_table(results: Results) -> str:
    """Table 8: per arm, aggregate tok/s and speedup vs AR at each batch size, and whether every
    output at every batch size equals AR's batch-1 output."""
    arms, sizes = _by_arm(results), batch_sizes(results)
    if not arms:
        return NO_SWEEP
    rows = []
    for _, label, mine in arms:
        at = {r.batch_size: r for r in mine}
        cells: list[str | None] = [label]
        for b in sizes:
            r = at.get(b)
            cells += [fmt(r.tokens_per_s, 1), fmt(r.speedup_vs_ar, 2)] if r else [None, None]
        cells.append("yes" if all(r.exact for r in mine) else
                     "no (B = " + ", ".join(str(r.batch_size) for r in mine if not r.exact) + ")")
        rows.append(cells)
    header = ["arm", *[h for b in sizes for h in (f"B={b} tok/s", f"B={b} vs AR")],
              "exact (= AR batch 1)"]
    return markdown_table(header, rows)


def crossover(label: str, rows: Sequence[ConcurrencyRow]) -> str:
    """Where `rows` (one arm, increasing batch size) cross a speedup of 1.0 over AR, in words."""
    known = [(r.batch_size, r.speedup_vs_ar) for r in rows if r.speedup_vs_ar is not None]
    if not known:
        return f"{label}: no speedup vs AR measured."

    def at(b: int, s: float) -> str:
        return f"B={b} ({s:.2f}x)"
    crossings = [f"crosses {'below' if s2 < 1 else 'above'} 1.0 between {at(b1, s1)} "
                 f"and {at(b2, s2)}" for (b1, s1), (b2, s2) in zip(known, known[1:])
                 if (s1 >= 1) != (s2 >= 1)]
    if crossings:
        return f"{label}: speedup over AR {', then '.join(crossings)}."
    side = "at or above" if known[0][1] >= 1 else "below"
    span = ", ".join(f"{s:.2f}x" for _, s in known)
    return (f"{label}: speedup over AR stays {side} 1.0 from B={known[0][0]} up to "
            f"B={known[-1][0]} ({span}).")


def crossovers(results: Results) -> list[str]:
    """`crossover` of every speculative arm in the sweep."""
    return [crossover(label, rows) for arm_id, label, rows in _by_arm(results) if arm_id != AR]


def engine_goal(results: Results) -> Goal:
    """AR's aggregate tok/s at ENGINE_GOAL_BATCH over its batch-1 tok/s, against
    ENGINE_GOAL_RATIO (measured None when the sweep lacks either batch size)."""
    ar = _ar_tokens_per_s(results)
    ratio = ar[ENGINE_GOAL_BATCH] / ar[1] if 1 in ar and ENGINE_GOAL_BATCH in ar else None
    return Goal(f"AR at batch {ENGINE_GOAL_BATCH} / batch 1 aggregate tok/s", ratio,
                ENGINE_GOAL_RATIO, None, True)


def engine_goal_sentence(results: Results) -> str:
    """The engine goal, met or missed, with the measured ratio and both throughputs."""
    goal, b = engine_goal(results), ENGINE_GOAL_BATCH
    claim = f"Engine goal: AR at batch {b} >= {ENGINE_GOAL_RATIO:g}x its batch-1 aggregate tok/s"
    if goal.measured is None:
        return (f"{claim}: not measured (decoding.batch_sizes lacks 1 or {b}; "
                f"e.g. --set decoding.batch_sizes=[1,4,{b}]).")
    ar = _ar_tokens_per_s(results)
    return (f"{claim}: **{goal.verdict()}**, measured {goal.measured:.2f}x "
            f"({ar[b]:.1f} vs {ar[1]:.1f} tok/s).")


def short_passes_note(results: Results, min_s: float) -> str | None:
    """A warning naming the (arm, batch size) passes whose median wall time is under `min_s`."""
    labels = {a: arm.label for a, arm in results.arm_items()}
    short = [f"{labels.get(r.arm, r.arm)} at B={r.batch_size} ({r.wall_s:.2f} s)"
             for r in results.concurrency if r.wall_s < min_s]
    if not short:
        return None
    return (f"**Too short to time reliably:** passes under {min_s:g} s: {', '.join(short)}; "
            "raise decoding.num_prompts or decoding.max_new_tokens.")
