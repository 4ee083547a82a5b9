"""Does the block-diffusion head pay for itself? Its goals, judged from results.json.

Per head arm: speedup vs AR (tok/s over AR's), a round's draft / verify time, accepted tokens
per round (the bonus included, the paper's measure) on this run, and the draft / verify per round
at the paper's architecture (the cost profile). A missed goal names what misses it: the speedup
is decomposed as

    speedup = accepted per round x AR step / (draft + verify + other per round)

so the report says which term holds it back: acceptance (accepted per round), draft cost (draft
ms per round in AR steps), verify width (a verify of D + 1 positions in AR steps) or overhead
(the rest of a round).
"""

from __future__ import annotations

from dataclasses import dataclass

from peftbd.analysis.cost_at_scale import at_scale_ratio
from peftbd.analysis.tables import fmt, markdown_table
from peftbd.benchmarking.schema import Results, draft_verify_per_round
from peftbd.methods.arm import AR
from peftbd.methods.bd_head import ID as HEAD


def head_arms(results: Results) -> list[str]:
    """The block-diffusion head's arms in `results` (those of its method), the synthetic ones
    (forced acceptance: not the head's own) left out, in report order."""
    return [a for a, arm in results.arm_items()
            if arm.method == HEAD and "synthetic" not in arm.settings]


@dataclass(frozen=True)
class Goal:
    """One goal: the measured value, the bound it must meet and the one it aims for."""

    name: str
    measured: float | None
    bound: float
    aim: float | None
    at_least: bool  # True: measured >= bound; False: measured <= bound

    @property
    def met(self) -> bool | None:
        if self.measured is None:
            return None
        return self.measured >= self.bound if self.at_least else self.measured <= self.bound

    def verdict(self) -> str:
        if self.measured is None:
            return "not measured"
        if self.met:
            return "met"
        return f"missed by {abs(self.measured / self.bound - 1):.0%}"


GOALS = (("speedup vs AR", 1.3, 1.5, True), ("draft / verify per round", 0.35, 0.25, False),
         ("accepted tokens / round", 2.5, None, True),
         ("draft / verify per round at scale", 0.2, None, False))
"""(name, bound, aim, at least?) of each goal, in the issue's order."""


def _ar_step_ms(results: Results) -> float | None:
    ar = results.arms.get(AR)
    return None if ar is None else ar.round.verify_ms


def goals(results: Results, arm_id: str) -> list[Goal] | None:
    """The goals of head arm `arm_id`, or None when this run has no such arm."""
    arm, ar = results.arms.get(arm_id), results.arms.get(AR)
    if arm is None or ar is None:
        return None
    scale = at_scale_ratio(results, arm_id)
    values = (arm.tokens_per_s.mean / ar.tokens_per_s.mean,
              draft_verify_per_round(arm), arm.mean_accepted.mean,
              None if scale is None else scale[1])
    return [Goal(name, value, bound, aim, at_least)
            for (name, bound, aim, at_least), value in zip(GOALS, values, strict=True)]


def round_terms(results: Results, arm_id: str) -> str | None:
    """The speedup's decomposition (see module doc) of `arm_id`, in AR steps."""
    arm, step = results.arms.get(arm_id), _ar_step_ms(results)
    if arm is None or not step:
        return None
    rnd = arm.round
    total = 1e3 * rnd.t0_s
    other = max(total - rnd.draft_ms - rnd.verify_ms, 0.0)
    return (f"{arm.mean_accepted.mean:.2f} accepted / round x AR step {step:.2f} ms / "
            f"(draft {rnd.draft_ms / step:.2f} + verify {rnd.verify_ms / step:.2f} + "
            f"other {other / step:.2f} AR steps)")


def goals_table(results: Results) -> str:
    """One row per head arm and goal: measured, goal (aim), verdict; then each arm's round
    decomposition."""
    rows, notes = [], []
    for arm_id in head_arms(results):
        found = goals(results, arm_id)
        if found is None:
            continue
        label = results.arms[arm_id].label
        for g in found:
            bound = f"{'>=' if g.at_least else '<='} {g.bound:g}" + (f" (aim {g.aim:g})" if g.aim else "")
            rows.append([label, g.name, fmt(g.measured, 2), bound, g.verdict()])
        if (terms := round_terms(results, arm_id)) is not None:
            notes.append(f"- {label}: speedup = {terms}.")
    if not rows:
        return "_No block-diffusion head arm in this run._"
    return "\n\n".join([markdown_table(["arm", "goal", "measured", "goal (aim)", "verdict"], rows),
                        "\n".join(notes)])
