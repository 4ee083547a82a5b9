"""Drafting ahead's verdict (no Ray): the split app drafting ahead (placement "split-ahead",
`serving.draft_ahead`) against plain split, per method, at every client level both ran: how many
rounds used a pre-draft, the p50 latency it saved, and the saving the same run predicts (the
pre-drafted rounds of a request x split's draft call per round, which a used pre-draft hides
behind the verify). Colocated has nothing to compare: one device runs both roles in turn, so a
pre-draft could only add its forward to the round."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from peftbd.analysis.placement import LoadRow
from peftbd.analysis.tables import fmt_or_dash, markdown_table

AHEAD = "split-ahead"
"""The placement that drafts ahead; the verdicts of `placement_verdict` leave it out."""

GOAL_AHEAD_CLIENTS = 1
"""The goal: drafting ahead lowers split's p50 latency at this many clients."""


@dataclass(frozen=True)
class AheadVerdict:
    """One method at one client level: split (index 0) against split drafting ahead (1)."""

    method: str
    clients: int
    requests: tuple[int, int]
    p50_ms: tuple[float, float]
    pre_drafted: float | None  # the share of split-ahead's rounds that used a pre-draft
    rounds_per_request: float | None  # split-ahead's
    tokens_per_round: tuple[float | None, float | None]
    draft_ms_per_round: float | None  # split's draft call at this level (what a hit hides)
    # what drafting ahead cost a request, ms (split-ahead's rounds x its per-round excess over
    # split): its verify calls ran slower beside the pre-draft forward, other replica-side time
    # (a propose waiting behind a pre-draft still running), transport
    costs_ms: dict[str, float] = field(default_factory=dict)

    @property
    def saved_ms(self) -> float:
        """Split's p50 latency minus split-ahead's (> 0: drafting ahead saved time)."""
        return self.p50_ms[0] - self.p50_ms[1]

    @property
    def predicted_saved_ms(self) -> float | None:
        """Pre-drafted rounds per request x split's draft ms per round."""
        if None in (self.pre_drafted, self.rounds_per_request, self.draft_ms_per_round):
            return None
        return self.pre_drafted * self.rounds_per_request * self.draft_ms_per_round  # type: ignore[operator]


def ahead_verdicts(rows: Sequence[LoadRow]) -> list[AheadVerdict]:
    """A verdict per (method, clients) that both split and split-ahead ran."""
    at = {(r.placement, r.method, r.concurrency): r for r in rows}
    out = []
    for (placement, method, clients), ahead in sorted(at.items()):
        split = at.get(("split", method, clients))
        if placement != AHEAD or split is None:
            continue
        out.append(AheadVerdict(
            method=method, clients=clients, requests=(split.requests, ahead.requests),
            p50_ms=(split.p50_ms, ahead.p50_ms), pre_drafted=ahead.pre_drafted,
            rounds_per_request=ahead.rounds_per_request,
            tokens_per_round=(split.tokens_per_round, ahead.tokens_per_round),
            draft_ms_per_round=split.draft_ms_per_round, costs_ms=_costs(split, ahead)))
    return out


def _costs(split: LoadRow, ahead: LoadRow) -> dict[str, float]:
    """Per request, split-ahead's excess over split in each term both measured (module doc)."""
    rounds = ahead.rounds_per_request or 0.0
    out = {}
    for term, key in (("verify", "verify_ms_per_round"), ("other", "other_ms_per_round")):
        mine, theirs = getattr(ahead, key), getattr(split, key)
        if mine is not None and theirs is not None:
            out[term] = round((mine - theirs) * rounds, 1)
    if ahead.transport_ms_per_token is not None and split.transport_ms_per_token is not None:
        tokens = (ahead.tokens_per_round or 0.0) * rounds + 1  # the prefill's token too
        out["transport"] = round((ahead.transport_ms_per_token - split.transport_ms_per_token)
                                 * tokens, 1)
    return out


def ahead_sentence(v: AheadVerdict) -> str:
    """One verdict in words, the issue's goal included where it applies."""
    share = "-" if v.pre_drafted is None else f"{v.pre_drafted:.0%}"
    words = (f"{v.method} at {v.clients} client{'s' * (v.clients > 1)}: drafting ahead used a "
             f"pre-draft in {share} of its rounds and moved split's p50 latency from "
             f"{v.p50_ms[0]:.0f} to {v.p50_ms[1]:.0f} ms ({v.saved_ms:+.0f} ms saved; "
             f"predicted {fmt_or_dash(v.predicted_saved_ms, 0)} ms from its pre-drafted rounds "
             f"x split's {fmt_or_dash(v.draft_ms_per_round, 0)} ms draft; {v.requests[1]} "
             "requests each).")
    if v.costs_ms:
        worst = max(v.costs_ms, key=v.costs_ms.__getitem__)
        words += (" Against split, per request: " + ", ".join(
            f"{term} {ms:+.0f} ms" for term, ms in v.costs_ms.items())
            + (f"; it lost most to {worst}." if v.costs_ms[worst] > 0 else "."))
    if v.clients == GOAL_AHEAD_CLIENTS:
        words += f" Goal (lower p50 at {GOAL_AHEAD_CLIENTS} client): " + (
            "met." if v.saved_ms > 0 else "missed.")
    return words


def ahead_markdown(found: Sequence[AheadVerdict]) -> list[str]:
    """placement.md's drafting-ahead section (nothing when split-ahead did not run)."""
    if not found:
        return []
    rows = [[v.method, v.clients, f"{v.p50_ms[0]:.0f}", f"{v.p50_ms[1]:.0f}", f"{v.saved_ms:+.0f}",
             fmt_or_dash(v.predicted_saved_ms, 0), fmt_or_dash(v.pre_drafted),
             fmt_or_dash(v.tokens_per_round[0]), fmt_or_dash(v.tokens_per_round[1])] for v in found]
    header = ["method", "clients", "p50 ms split", "p50 ms split-ahead", "ms saved",
              "ms saved predicted", "rounds pre-drafted", "tokens/round split",
              "tokens/round split-ahead"]
    return ["", "## Drafting ahead", "", markdown_table(header, rows), "",
            "split-ahead: while a round verifies, the idle Drafter drafts the next round for the "
            "request's likeliest accepted length (its most frequent so far); a round whose verify "
            "accepted exactly that many skips its propose call. Predicted saving = pre-drafted "
            "rounds per request x split's draft ms per round; against it, per request, what "
            "split-ahead's rounds spent beyond split's in verify (slower beside a pre-draft "
            "forward: two forwards share this machine's cores and memory), other replica time "
            "(a propose waiting behind a pre-draft) and transport. Under controlled acceptance a "
            "pre-draft accepts what its round draws anyway (`python -m jobs.ahead_study` measures "
            "that on real acceptance). Colocated cannot draft ahead: its one device runs both "
            "roles in turn.", "",
            *[f"- {ahead_sentence(v)}" for v in found]]
