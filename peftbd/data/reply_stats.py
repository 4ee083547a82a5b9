"""What the verifier's replies look like: length distribution and a repetition measure.

The continuation artifact records these (`replies` in its manifest) so a reader can check the
regime the drafters are measured in: replies that run for many D-token blocks (the paper: up to
256 new tokens) and are text, not degenerate loops. Repetition = distinct 4-gram share of a reply
(distinct 4-grams / 4-grams; 1.0 = no 4-gram repeats, a reply looping a short phrase -> ~0).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

NGRAM = 4
LOOP_BELOW = 0.5
"""A reply whose distinct 4-gram share is under this counts as a loop."""


def distinct_ngram_share(tokens: Sequence[int], n: int = NGRAM) -> float | None:
    """Distinct n-grams / n-grams of `tokens` (None when shorter than n)."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


def _percentile(sorted_values: Sequence[int], q: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def reply_stats(replies: Sequence[Sequence[int]]) -> dict[str, float | int | None]:
    """Length (tokens: mean, p10, p50, p90, max) and repetition (mean distinct 4-gram share,
    share of loops) of `replies`; all None for no replies."""
    lengths = sorted(len(r) for r in replies)
    shares = [s for r in replies if (s := distinct_ngram_share(r)) is not None]
    if not lengths:
        return {k: None for k in ("replies", "mean_tokens", "p10_tokens", "p50_tokens",
                                  "p90_tokens", "max_tokens", "distinct_4gram_share",
                                  "loop_share")}
    return {
        "replies": len(lengths),
        "mean_tokens": round(statistics.fmean(lengths), 2),
        "p10_tokens": _percentile(lengths, 0.1),
        "p50_tokens": _percentile(lengths, 0.5),
        "p90_tokens": _percentile(lengths, 0.9),
        "max_tokens": lengths[-1],
        "distinct_4gram_share": round(statistics.fmean(shares), 4) if shares else None,
        "loop_share": round(sum(s < LOOP_BELOW for s in shares) / len(shares), 4) if shares else None,
    }
