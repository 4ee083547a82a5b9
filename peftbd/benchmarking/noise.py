"""How far a batch-1 throughput measured once over a prompt set can be trusted: intervals over the
prompts (`peftbd.intervals`: the studentized bootstrap, seeded), for an arm's tok/s and, paired
prompt by prompt, for its speedup over AR; and how far its acceptance can: the same interval for
its tokens per round (the engine's `mean_accepted`, bonus included), and for its equal-weight
mix over the prompt categories.

One timed repeat decodes every prompt once per arm; the interval says how much the number would
move with another draw of prompts of the same kind, the noise that more repeats of the same
prompts cannot shrink. The report states it beside every batch-1 throughput and every arm's
tokens per round (greedy repeats decode the same rounds, so only the prompts move acceptance).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from peftbd.decoding import DecodeResult
from peftbd.intervals import equal_weight_interval, ratio_interval, ratio_of_ratios_interval


def _totals(runs: Sequence[Sequence[DecodeResult]]) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: tokens and seconds summed over the repeats (`runs[repeat][prompt]`)."""
    tokens = np.array([[len(r.tokens) for r in run] for run in runs], dtype=float).sum(axis=0)
    seconds = np.array([[r.decode_s for r in run] for run in runs], dtype=float).sum(axis=0)
    return tokens, seconds


def throughput_interval(runs: Sequence[Sequence[DecodeResult]]) -> tuple[float, float] | None:
    """The interval of tokens / seconds over the prompts (None: under 2 prompts)."""
    return ratio_interval(*_totals(runs))


def speedup_interval(runs: Sequence[Sequence[DecodeResult]],
                     baseline: Sequence[Sequence[DecodeResult]]) -> tuple[float, float] | None:
    """The interval of (tok/s of `runs`) / (tok/s of `baseline`), paired prompt by prompt (None:
    under 2 prompts, or the two did not decode the same prompts)."""
    tokens, seconds = _totals(runs)
    base_tokens, base_seconds = _totals(baseline)
    if len(tokens) != len(base_tokens):
        return None
    return ratio_of_ratios_interval(tokens, seconds, base_tokens, base_seconds)


def round_totals(runs: Sequence[Sequence[DecodeResult]]) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt with a round: tokens emitted by its rounds (accepted + bonus,
    `RoundMetrics.emitted`) and its rounds, summed over the repeats (`runs[repeat][prompt]`). A
    prompt without a round (its output ended at prefill) adds to neither sum and is left out."""
    emitted = np.array([[sum(r.emitted for r in res.rounds) for res in run] for run in runs],
                       dtype=float).sum(axis=0)
    rounds = np.array([[len(res.rounds) for res in run] for run in runs], dtype=float).sum(axis=0)
    keep = rounds > 0
    return emitted[keep], rounds[keep]


def acceptance_interval(runs: Sequence[Sequence[DecodeResult]]) -> tuple[float, float] | None:
    """The interval of tokens per round = emitted tokens / rounds over the prompts with a round
    (`round_totals`), the engine's `mean_accepted` (`peftbd.decoding.metrics.summarize`: bonus
    included), each prompt's repeats pooled (None: under 2 prompts with a round)."""
    return ratio_interval(*round_totals(runs))


def acceptance_mix(by_category: Sequence[Sequence[Sequence[DecodeResult]]]
                   ) -> tuple[float, tuple[float, float] | None] | None:
    """Tokens per round with every category weighted equally (`by_category[c][repeat][prompt]`):
    the mean over the categories of each one's emitted tokens / rounds (`round_totals`), and its
    interval, prompts resampled within their category (None: no categories, or one without a
    round; the interval None: a category with under 2 prompts with a round)."""
    totals = [round_totals(runs) for runs in by_category]
    if not totals or any(not len(rounds) for _, rounds in totals):
        return None
    return equal_weight_interval(totals)
