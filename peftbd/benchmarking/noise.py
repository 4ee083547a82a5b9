"""How far a batch-1 throughput measured once over a prompt set can be trusted: bootstrap
intervals over the prompts (resampled with replacement, seeded), for an arm's tok/s and, paired
prompt by prompt, for its speedup over AR; and how far its acceptance can: the same interval for
its tokens per round (the engine's `mean_accepted`, bonus included).

One timed repeat decodes every prompt once per arm; the interval says how much the number would
move with another draw of prompts of the same kind, the noise that more repeats of the same
prompts cannot shrink. The report states it beside every batch-1 throughput and every arm's
tokens per round (greedy repeats decode the same rounds, so only the prompts move acceptance).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from peftbd.decoding import DecodeResult

RESAMPLES = 2000
LEVEL = 0.95
SEED = 0


def _totals(runs: Sequence[Sequence[DecodeResult]]) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: tokens and seconds summed over the repeats (`runs[repeat][prompt]`)."""
    tokens = np.array([[len(r.tokens) for r in run] for run in runs], dtype=float).sum(axis=0)
    seconds = np.array([[r.decode_s for r in run] for run in runs], dtype=float).sum(axis=0)
    return tokens, seconds


def _interval(samples: np.ndarray) -> tuple[float, float]:
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(samples, [tail, 1 - tail])
    return float(low), float(high)


def _draws(n: int) -> np.ndarray:
    """RESAMPLES x n prompt indices, the same for every arm (so paired intervals pair)."""
    return np.random.default_rng(SEED).integers(0, n, size=(RESAMPLES, n))


def throughput_interval(runs: Sequence[Sequence[DecodeResult]]) -> tuple[float, float] | None:
    """LEVEL bootstrap interval of tokens / seconds over the prompts (None: under 2 prompts)."""
    tokens, seconds = _totals(runs)
    if len(tokens) < 2:
        return None
    idx = _draws(len(tokens))
    return _interval(tokens[idx].sum(axis=1) / seconds[idx].sum(axis=1))


def speedup_interval(runs: Sequence[Sequence[DecodeResult]],
                     baseline: Sequence[Sequence[DecodeResult]]) -> tuple[float, float] | None:
    """LEVEL bootstrap interval of (tok/s of `runs`) / (tok/s of `baseline`), the same prompts
    drawn for both (None: under 2 prompts, or the two did not decode the same prompts)."""
    tokens, seconds = _totals(runs)
    base_tokens, base_seconds = _totals(baseline)
    if len(tokens) < 2 or len(tokens) != len(base_tokens):
        return None
    idx = _draws(len(tokens))
    ours = tokens[idx].sum(axis=1) / seconds[idx].sum(axis=1)
    theirs = base_tokens[idx].sum(axis=1) / base_seconds[idx].sum(axis=1)
    return _interval(ours / theirs)


def _round_totals(runs: Sequence[Sequence[DecodeResult]]) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: tokens emitted by its rounds (accepted + bonus, `RoundMetrics.emitted`) and its
    rounds, summed over the repeats (`runs[repeat][prompt]`)."""
    emitted = np.array([[sum(r.emitted for r in res.rounds) for res in run] for run in runs],
                       dtype=float).sum(axis=0)
    rounds = np.array([[len(res.rounds) for res in run] for run in runs], dtype=float).sum(axis=0)
    return emitted, rounds


def acceptance_interval(runs: Sequence[Sequence[DecodeResult]]) -> tuple[float, float] | None:
    """LEVEL bootstrap interval of tokens per round = emitted tokens / rounds over the prompts,
    the engine's `mean_accepted` (`peftbd.decoding.metrics.summarize`: bonus included), each
    prompt's repeats pooled (None: under 2 prompts with a round). A prompt without a round (its
    output ended at prefill) adds to neither sum and is left out of the draw."""
    emitted, rounds = _round_totals(runs)
    keep = rounds > 0
    emitted, rounds = emitted[keep], rounds[keep]
    if len(rounds) < 2:
        return None
    idx = _draws(len(rounds))
    return _interval(emitted[idx].sum(axis=1) / rounds[idx].sum(axis=1))
