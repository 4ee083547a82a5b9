"""The report's Findings: the paper's findings (a)-(f), each checked against this run's numbers.

The paper states its findings in prose, not as a list; these are the six its results rest on
(sections 5.1-5.3 and 8.5-8.7), lettered in the paper's order. Every verdict is computed from
results.json alone: REPRODUCED when each condition of the claim holds here, NOT_REPRODUCED naming
the measured quantity that differs, NOT_MEASURABLE when an arm or number it needs is missing.
The paper's numbers (in brackets) come from `peftbd.analysis.paper`. The findings are about the
paper's methods by design: the arms they read are PEFT-BD's, FastMTP's and AR's main ones (named
by their method modules) and the two PEFT-BD ablations under the paper's names for them.

The cost facts (a)'s throughput, (b)'s draft/verify ratio) are judged at the paper's architecture
when the run has a cost profile (`peftbd.analysis.cost_at_scale`: cost at scale x acceptance from
this run), with this run's own numbers beside them; without one, on this run's numbers alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from peftbd.analysis.cost_at_scale import LABEL as AT_SCALE, at_scale_ratio, projected
from peftbd.analysis.paper import (
    HF_LOOP,
    ORACLE,
    PAPER_AR,
    PAPER_BLOCK_SIZE,
    PAPER_FASTMTP,
    PAPER_PEFTBD,
    PAPER_PEFTBD_2STEP,
    PAPER_PEFTBD_ANCHORED,
    PROFILE,
    SGLANG,
    paper_value,
)
from peftbd.benchmarking.schema import Arm, Results, draft_verify_per_call, draft_verify_per_round
from peftbd.methods.arm import AR
from peftbd.methods.fastmtp import ID as FASTMTP
from peftbd.methods.peft_bd import ID as PEFTBD

REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE = "reproduced", "not reproduced", "not measurable here"

SAME_COST = 0.2
"""(b) "about the same cost": a draft forward within ±20% of a verify forward (paper: 0.99)."""
UNCHANGED = 0.1
"""(e) "essentially unchanged" throughput: within ±10% (paper: 15.4-15.6 tok/s)."""

CLAIMS: dict[str, str] = {
    "a": "A longer accepted prefix does not buy throughput: PEFT-BD accepts more tokens per round "
         "than FastMTP yet decodes far slower (§5.1).",
    "b": "The draft is verifier-scale: a PEFT-BD draft forward costs about as much as a verify "
         "forward (§5.2, §8.5).",
    "c": "Even free drafting would not reach FastMTP: the draft-cost oracle at r = 1 stays below "
         "FastMTP's throughput (§5.2, §8.7).",
    "d": "Two denoising steps lower both throughput and accepted length (§5.3).",
    "e": "Anchoring raises the accepted length slightly but leaves throughput essentially "
         "unchanged (§5.3).",
    "f": "At this scale greedy AR beats both speculative methods, and matching it would take more "
         "accepted tokens per round than the block holds (§8.6, §8.7).",
}


@dataclass(frozen=True)
class Finding:
    """One paper finding checked on this run: its `claim`, the `measured` quantities the verdict
    rests on (ours, the paper's in brackets), the `verdict` and `why`."""

    key: str
    claim: str
    measured: str
    verdict: str
    why: str

    def markdown(self) -> str:
        return (f"- **({self.key})** {self.claim} **{self.verdict.capitalize()}.** "
                f"Measured: {self.measured}. Why: {self.why}.")


Check = tuple[bool, str, str]
"""(holds, what to say when it holds, what to say when it does not)."""


def _judge(key: str, measured: str, checks: Sequence[Check]) -> Finding:
    failed = [miss for holds, _, miss in checks if not holds]
    if failed:
        return Finding(key, CLAIMS[key], measured, NOT_REPRODUCED, "; ".join(failed))
    return Finding(key, CLAIMS[key], measured, REPRODUCED, "; ".join(hit for _, hit, _ in checks))


def _unmeasurable(key: str, needs: str) -> Finding:
    return Finding(key, CLAIMS[key], "none", NOT_MEASURABLE, f"needs {needs}, which this run lacks")


def _arms(results: Results, *arm_ids: str) -> list[Arm] | None:
    """The arms `arm_ids`, in that order; None unless this run has every one."""
    if any(a not in results.arms for a in arm_ids):
        return None
    return [results.arms[a] for a in arm_ids]


def _tps(arm: Arm) -> float:
    return arm.tokens_per_s.mean


def _acc(arm: Arm) -> float:
    return arm.mean_accepted.mean


def _paper(metric: str, arm: str, measured_on: str = SGLANG) -> str:
    return paper_value(metric, arm, measured_on).quoted


def _free_drafting(arm: Arm) -> float | None:
    """The oracle's throughput with the draft cost removed (r = 1)."""
    if arm.oracle is None:
        return None
    return next((r.tokens_per_s for r in arm.oracle.reductions if r.r == 1.0), None)


def _needed(arm: Arm, target: str) -> float | None:
    return None if arm.oracle is None else arm.oracle.needed_accepted.get(target)


def longer_prefix_not_faster(results: Results) -> Finding:
    """(a) PEFT-BD vs FastMTP: more accepted tokens per round, less throughput (projected at the
    paper's architecture when profiled, else as measured here)."""
    arms = _arms(results, PEFTBD, FASTMTP)
    if arms is None:
        return _unmeasurable("a", "the PEFT-BD and FastMTP arms")
    pa, fa, pt, ft = _acc(arms[0]), _acc(arms[1]), _tps(arms[0]), _tps(arms[1])
    measured = (f"accepted tokens / round PEFT-BD {pa:.2f} vs FastMTP {fa:.2f} "
                f"[{_paper('mean_accepted', PAPER_PEFTBD)} vs "
                f"{_paper('mean_accepted', PAPER_FASTMTP)}]; tok/s {pt:.1f} vs {ft:.1f} "
                f"[{_paper('tokens_per_s', PAPER_PEFTBD)} vs "
                f"{_paper('tokens_per_s', PAPER_FASTMTP)}]")
    where = ""
    peftbd_at_scale, fastmtp_at_scale = projected(results, PEFTBD), projected(results, FASTMTP)
    if peftbd_at_scale is not None and fastmtp_at_scale is not None:
        pt, ft = peftbd_at_scale.tokens_per_s, fastmtp_at_scale.tokens_per_s
        where = f" at scale ({AT_SCALE})"
        measured += f"; at scale ({AT_SCALE}) tok/s {pt:.1f} vs {ft:.1f}"
    return _judge("a", measured, [
        (pa > fa, f"PEFT-BD accepts {pa / fa:.2f}x FastMTP's tokens per round",
         f"PEFT-BD accepts no more tokens per round than FastMTP ({pa:.2f} vs {fa:.2f})"),
        (pt < ft, f"at {pt / ft:.2f}x its throughput{where}",
         f"PEFT-BD is not slower than FastMTP ({pt:.1f} vs {ft:.1f} tok/s{where})"),
    ])


def draft_is_verifier_scale(results: Results) -> Finding:
    """(b) PEFT-BD's draft forward vs its verify forward: at the paper's architecture when
    profiled (one draft forward per round, so per round = per call), else on this run."""
    arms = _arms(results, PEFTBD)
    per_call = draft_verify_per_call(arms[0]) if arms else None
    scaled = at_scale_ratio(results, PEFTBD)
    if scaled is not None:
        ratio, where = scaled[1], "at the paper's architecture"
    elif per_call is not None:
        ratio, where = per_call, "at this size"
    else:
        return _unmeasurable("b", "the PEFT-BD arm's draft and verify forward times")
    paper_ratio = (paper_value("draft_mean_ms", PAPER_PEFTBD, PROFILE).number
                   / paper_value("verify_mean_ms", PAPER_PEFTBD, PROFILE).number)
    parts = []
    if scaled is not None:
        parts.append(f"PEFT-BD draft / verify per round at the paper's architecture "
                     f"({scaled[0]}) {scaled[1]:.2f} [{paper_ratio:.2f}]")
    if arms is not None and per_call is not None:
        fwd = arms[0].forward
        parts.append(f"on this run per forward call {per_call:.2f}, per round "
                     f"{draft_verify_per_round(arms[0]):.2f}; draft vs verify calls "
                     f"{fwd.draft.calls} vs {fwd.verify.calls} "
                     f"[{_paper('draft_calls', PAPER_PEFTBD, PROFILE)} vs "
                     f"{_paper('verify_calls', PAPER_PEFTBD, PROFILE)}]")
    side = ("dearer: no draft/verify asymmetry either, but not the paper's near-equality"
            if ratio > 1 else "cheaper: some asymmetry exists")
    return _judge("b", "; ".join(parts), [
        (abs(ratio - 1) <= SAME_COST,
         f"a draft forward costs {ratio:.2f}x a verify forward {where}, within ±{SAME_COST:.0%}",
         f"a draft forward costs {ratio:.2f}x a verify forward {where}, beyond ±{SAME_COST:.0%} "
         f"({side})"),
    ])


def free_drafting_below_fastmtp(results: Results) -> Finding:
    """(c) The oracle's PEFT-BD throughput at zero draft cost vs FastMTP's measured one."""
    arms = _arms(results, PEFTBD, FASTMTP)
    free = _free_drafting(arms[0]) if arms else None
    if arms is None or free is None:
        return _unmeasurable("c", "the PEFT-BD oracle and the FastMTP arm")
    ft, needed = _tps(arms[1]), _needed(arms[0], FASTMTP)
    measured = (f"PEFT-BD oracle tok/s at r = 1 {free:.1f} vs FastMTP measured {ft:.1f} "
                f"[{_paper('free_draft_tokens_per_s', PAPER_PEFTBD, ORACLE)} vs "
                f"{_paper('tokens_per_s', PAPER_FASTMTP)}]; accepted tokens / round needed to "
                f"match FastMTP {needed:.2f} "
                f"[{_paper('needed_accepted_vs_fastmtp', PAPER_PEFTBD, ORACLE)}]")
    return _judge("c", measured, [
        (free < ft, f"free drafting reaches {free / ft:.2f}x FastMTP's throughput",
         f"free drafting would reach {free / ft:.2f}x FastMTP's throughput: here the draft cost "
         f"alone stands between them"),
    ])


def two_steps_lower_both(results: Results) -> Finding:
    """(d) Two denoising steps vs one: throughput and accepted length."""
    arms = _arms(results, PEFTBD, PAPER_PEFTBD_2STEP)
    if arms is None:
        return _unmeasurable("d", "the 1-step and 2-step PEFT-BD arms")
    (t1, t2), (a1, a2) = [_tps(a) for a in arms], [_acc(a) for a in arms]
    measured = (f"tok/s 1 step {t1:.1f} vs 2 steps {t2:.1f} "
                f"[{_paper('tokens_per_s', PAPER_PEFTBD)} vs "
                f"{_paper('tokens_per_s', PAPER_PEFTBD_2STEP)}]; accepted tokens / round "
                f"{a1:.2f} vs {a2:.2f} [{_paper('mean_accepted', PAPER_PEFTBD)} vs "
                f"{_paper('mean_accepted', PAPER_PEFTBD_2STEP)}]")
    return _judge("d", measured, [
        (t2 < t1, f"two steps run at {t2 / t1:.2f}x one step's throughput",
         f"two steps are not slower ({t2:.1f} vs {t1:.1f} tok/s)"),
        (a2 < a1, f"and accept {a2 / a1:.2f}x its tokens per round",
         f"two steps do not accept fewer tokens per round ({a2:.2f} vs {a1:.2f})"),
    ])


def anchoring_changes_little(results: Results) -> Finding:
    """(e) Anchored vs unanchored 1-step PEFT-BD."""
    arms = _arms(results, PEFTBD, PAPER_PEFTBD_ANCHORED)
    if arms is None:
        return _unmeasurable("e", "the unanchored and anchored PEFT-BD arms")
    (t1, ta), (a1, aa) = [_tps(a) for a in arms], [_acc(a) for a in arms]
    change = ta / t1 - 1
    measured = (f"accepted tokens / round unanchored {a1:.2f} vs anchored {aa:.2f} "
                f"[{_paper('mean_accepted', PAPER_PEFTBD, HF_LOOP)} vs "
                f"{_paper('mean_accepted', PAPER_PEFTBD_ANCHORED, HF_LOOP)}]; tok/s {t1:.1f} vs "
                f"{ta:.1f} [{_paper('tokens_per_s', PAPER_PEFTBD_ANCHORED, HF_LOOP)}]")
    return _judge("e", measured, [
        (aa > a1, f"anchoring adds {aa - a1:+.2f} accepted tokens per round",
         f"anchoring does not raise accepted tokens per round ({a1:.2f} -> {aa:.2f})"),
        (abs(change) <= UNCHANGED, f"throughput moves {change:+.1%}, within ±{UNCHANGED:.0%}",
         f"throughput moves {change:+.1%}, beyond ±{UNCHANGED:.0%}"),
    ])


def ar_is_fastest(results: Results) -> Finding:
    """(f) Greedy AR vs both speculative methods, and the accepted length needed to match AR."""
    arms = _arms(results, AR, PEFTBD, FASTMTP)
    needed = _needed(arms[1], AR) if arms else None
    if arms is None or needed is None:
        return _unmeasurable("f", "the AR, PEFT-BD and FastMTP arms and the PEFT-BD oracle")
    (ta, tp, tf), block = [_tps(a) for a in arms], results.config[PEFTBD]["block_size"]
    best = max(tp, tf)
    measured = (f"tok/s AR {ta:.1f} vs FastMTP {tf:.1f} vs PEFT-BD {tp:.1f} "
                f"[{_paper('tokens_per_s', PAPER_AR)} vs {_paper('tokens_per_s', PAPER_FASTMTP)} "
                f"vs {_paper('tokens_per_s', PAPER_PEFTBD)}]; accepted tokens / round PEFT-BD "
                f"needs to match AR {needed:.2f} vs block size D = {block} "
                f"[{_paper('needed_accepted_vs_ar', PAPER_PEFTBD, ORACLE)} vs "
                f"D = {PAPER_BLOCK_SIZE}]")
    return _judge("f", measured, [
        (ta > best, f"AR runs at {ta / best:.2f}x the faster speculative arm",
         f"the faster speculative arm beats AR ({best:.1f} vs {ta:.1f} tok/s)"),
        (needed > block, f"matching AR needs {needed:.2f} accepted tokens per round, more than D",
         f"matching AR needs {needed:.2f} accepted tokens per round, within D = {block}"),
    ])


FINDINGS: tuple[Callable[[Results], Finding], ...] = (
    longer_prefix_not_faster, draft_is_verifier_scale, free_drafting_below_fastmtp,
    two_steps_lower_both, anchoring_changes_little, ar_is_fastest,
)
"""The checks of findings (a)-(f), in order."""


def findings(results: Results) -> list[Finding]:
    """Findings (a)-(f) with this run's verdicts."""
    return [check(results) for check in FINDINGS]
