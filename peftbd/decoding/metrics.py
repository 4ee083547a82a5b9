"""Run-level metrics over decoded requests: the paper's Table 1 shape plus the oracle's inputs.

Definitions (per run, summed over its requests):

- tokens_per_s: generated tokens / measured decode seconds (prefill + every round).
- mean_accepted: the paper's "accepted tokens per speculative step" = mean tokens emitted per
  round = accepted draft tokens + the verifier's bonus token (1.0 for greedy AR).
- mean_accepted_prefix: mean accepted draft tokens per round (bonus excluded).
- Every accepted count stops at the committed output: draft tokens that match the verifier past
  the EOS or the token budget that ended it are not accepted (`RoundMetrics.accepted`).
- token_acceptance: accepted / proposed draft tokens.
- block_acceptance: share of rounds with a draft whose every proposed token was accepted.
- per_position: for draft position j = 1..D (D = the longest draft of a round; FastMTP: its
  steps), lists indexed j - 1 (vLLM's num_accepted_tokens_per_pos, with its own denominator):
  proposed = rounds whose draft has position j, reached = those whose positions 1..j-1 were all
  accepted (and the output did not end before j: positions after an EOS or the budget inside
  the draft are proposed, never reached), accepted = those whose accepted prefix reaches j;
  rate = accepted / proposed, conditional = accepted / reached = P(accept j | accepted j - 1).
  Sum of accepted = accepted draft tokens. When every round proposes D, rate is non-increasing
  in j.
- forward: calls and mean latency per mode (prefill, draft, verify, sync).
- round: t0_s = mean round time (the oracle's T0), mean draft / verify ms per round (every draft
  call of a round summed) and the draft / verify / other time shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from peftbd.decoding.state import RoundMetrics


@dataclass
class DecodeResult:
    """One decoded request: generated `tokens` (EOS included when it stopped on one), its
    `rounds`, prefill seconds and forward calls/seconds per mode."""

    tokens: list[int]
    rounds: list[RoundMetrics]
    prefill_s: float = 0.0
    forward_calls: dict[str, int] = field(default_factory=dict)
    forward_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def decode_s(self) -> float:
        return self.prefill_s + sum(r.total_ms for r in self.rounds) / 1e3

    @property
    def metrics(self) -> dict[str, Any]:
        """`summarize([self])`."""
        return summarize([self])


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _per_position(rounds: Sequence[RoundMetrics]) -> dict[str, list]:
    """Acceptance per draft position over `rounds` (see the module docstring)."""
    positions = range(1, max((r.proposed for r in rounds), default=0) + 1)
    proposed = [sum(r.proposed >= j for r in rounds) for j in positions]
    reached = [sum(r.proposed >= j and r.accepted >= j - 1
                   and not (r.ended_in_draft and j > r.accepted) for r in rounds) for j in positions]
    accepted = [sum(r.accepted >= j for r in rounds) for j in positions]
    return {
        "proposed": proposed, "reached": reached, "accepted": accepted,
        "rate": [_ratio(a, n) for a, n in zip(accepted, proposed)],
        "conditional": [_ratio(a, n) for a, n in zip(accepted, reached)],
    }


def summarize(results: Sequence[DecodeResult]) -> dict[str, Any]:
    """Run metrics over `results` (see the module docstring for each definition)."""
    rounds = [r for res in results for r in res.rounds]
    drafted = [r for r in rounds if r.proposed > 0]
    new_tokens = sum(len(res.tokens) for res in results)
    decode_s = sum(res.decode_s for res in results)
    round_ms = sum(r.total_ms for r in rounds)
    calls: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for res in results:
        for mode, n in res.forward_calls.items():
            calls[mode] = calls.get(mode, 0) + n
            seconds[mode] = seconds.get(mode, 0.0) + res.forward_seconds[mode]
    return {
        "prompts": len(results),
        "new_tokens": new_tokens,
        "decode_s": decode_s,
        "tokens_per_s": _ratio(new_tokens, decode_s),
        "prefill_s": sum(res.prefill_s for res in results),
        "rounds": len(rounds),
        "mean_accepted": _ratio(sum(r.emitted for r in rounds), len(rounds)),
        "mean_accepted_prefix": _ratio(sum(r.accepted for r in rounds), len(rounds)),
        "token_acceptance": _ratio(sum(r.accepted for r in drafted), sum(r.proposed for r in drafted)),
        "block_acceptance": _ratio(sum(r.accepted == r.proposed for r in drafted), len(drafted)),
        "per_position": _per_position(drafted),
        "forward": {
            mode: {"calls": n, "mean_ms": seconds[mode] / n * 1e3} for mode, n in sorted(calls.items())
        },
        "round": {
            "t0_s": _ratio(round_ms / 1e3, len(rounds)),
            "draft_ms": _ratio(sum(r.draft_ms for r in rounds), len(rounds)),
            "verify_ms": _ratio(sum(r.verify_ms for r in rounds), len(rounds)),
            "draft_share": _ratio(sum(r.draft_ms for r in rounds), round_ms),
            "verify_share": _ratio(sum(r.verify_ms for r in rounds), round_ms),
            "other_share": _ratio(sum(r.other_ms for r in rounds), round_ms),
        },
    }
