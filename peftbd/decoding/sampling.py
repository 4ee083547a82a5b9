"""Per-request sampling parameters and lossless speculative sampling (vLLM's rejection sampler
for argmax drafts).

A sampled request's target distribution at each position is p = softmax(logits / T) after top-k,
then top-p filtering (vLLM's order). A draft token x (drafters propose argmax tokens: q is
one-hot) is accepted with probability min(1, p(x) / q(x)) = p(x): u < p(x) with u uniform in
[0, 1) (strict, so a zero-probability token is never accepted); at the first rejection the token
is drawn from the normalised max(p - q, 0) = p with x zeroed; a slot without a draft token (the
bonus, prefill's first token) draws from p. Every output token is thus distributed exactly as
sampling from p would give it (tested against AR sampling).

Draws are counter-based: a request's uniforms are a hash of (seed, index of the output token
the slot decides, stream), one stream for the acceptance test and another for the token draw
(reusing the acceptance uniform for the draw would bias it). Each output token is decided once,
by draws no earlier decision used, so the rule stays lossless; a seeded request's output is a
function of its prompt, seed and drafter, whatever the batch it runs in (up to floating-point
differences in the logits, which flip a draw only when it lands within rounding of a boundary).
A request without a seed gets a random one when it starts.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeVar, cast

import numpy as np
import torch

_ACCEPT, _DRAW = 0, 1  # the two streams of draws
_GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a lower temperature decodes greedily


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 (below 1e-5, as vLLM): greedy, the argmax code path (the other fields are
    ignored). top_p: the nucleus mass kept (1: all); top_k: the most likely tokens kept (0: all);
    seed: the request's draws (None: a random one at start)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name}={value!r}; use a number")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature={self.temperature}; use 0 (greedy) or more")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}; use a value in (0, 1] (1: no nucleus filter)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r}; use an int >= 0 (0: no top-k filter)")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed={self.seed!r}; use an int or None")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_BELOW

    def resolved(self) -> SamplingParams:
        """These parameters with a random seed if they sample without one."""
        return self if self.greedy or self.seed is not None else replace(self, seed=secrets.randbits(63))


GREEDY = SamplingParams()


T = TypeVar("T")


def per_request(value: T | Sequence[T] | None, n: int, default: T, one: type[T], name: str) -> list[T]:
    """One `value` per request of `n` from None (`default`), one for all (an instance of `one`),
    or one each; `name` (the argument) in the error for a list of the wrong length."""
    if value is None:
        return [default] * n
    if isinstance(value, one):
        return [value] * n
    each = cast("Sequence[T]", value)  # not one `one`: one per request
    if len(each) != n:
        raise ValueError(f"{name} has {len(each)} entries for {n} prompts; pass one "
                         f"{one.__name__}, or one per prompt")
    return list(each)


def target_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """p (float32, the shape of `logits` (R, Q, V)): row r's softmax(logits / T) after its
    top-k, then top-p filter (vLLM's `apply_top_k_top_p`: top-p keeps the smallest set of most
    likely tokens whose mass reaches top_p, ties at the top-k threshold are kept)."""
    device, vocab = logits.device, logits.shape[-1]
    temperature = torch.tensor([p.temperature for p in params], device=device).view(-1, 1, 1)
    logits = logits.float() / temperature
    if any(0 < p.top_k < vocab or p.top_p < 1 for p in params):
        ranked, order = logits.sort(-1)  # ascending
        k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)
        threshold = ranked.gather(-1, (vocab - k).view(-1, 1, 1).expand(*ranked.shape[:2], 1))
        ranked = ranked.masked_fill(ranked < threshold, -math.inf)
        top_p = torch.tensor([p.top_p for p in params], device=device).view(-1, 1, 1)
        cut = ranked.softmax(-1).cumsum(-1) <= 1 - top_p
        cut[..., -1] = False  # the most likely token always stays
        logits = torch.empty_like(ranked).scatter_(-1, order, ranked.masked_fill(cut, -math.inf))
    return logits.softmax(-1)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping arithmetic): a bijection that scatters bits."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniforms(seeds: Sequence[int], index: np.ndarray, stream: int) -> np.ndarray:
    """Uniforms in [0, 1) (53 random bits), one per entry of `index` (R, W): row r's entry j
    depends only on (seeds[r], index[r, j], stream)."""
    key = _mix(np.array([s % 2**64 for s in seeds], dtype=np.uint64)
               + np.uint64(0x9E3779B97F4A7C15 * (stream + 1) % 2**64))
    bits = _mix(key[:, None] ^ _mix(index.astype(np.uint64)))
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def accepts(u: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """The acceptance test min(1, p(x) / q(x)) > u for a one-hot q: strictly u < p(x)."""
    return u < p_draft


def lossless_tokens(logits: torch.Tensor, params: Sequence[SamplingParams],
                    drafts: Sequence[Sequence[int]], generated: Sequence[int]) -> torch.Tensor:
    """The verifier's token (R, Q) at every slot of sampled rows (see the module doc): row r's
    slot j < len(drafts[r]) holds drafts[r][j] if accepted, else its residual draw; slot
    len(drafts[r]) draws from p; later slots are padding (arbitrary). `logits` (R, Q, V): slot j
    of row r decides output token generated[r] + j; `params` must carry seeds (`resolved`)."""
    rows, width, vocab = logits.shape
    device = logits.device
    seeds = [p.seed for p in params if p.seed is not None]
    if len(seeds) != len(params):
        raise ValueError("lossless_tokens needs every row's seed: pass SamplingParams.resolved()")
    probs = target_probs(logits, params)
    draft = torch.tensor([[*d, *[0] * (width - len(d))] for d in drafts], device=device).unsqueeze(-1)
    lengths = torch.tensor([len(d) for d in drafts], device=device)
    has_draft = torch.arange(width, device=device) < lengths.unsqueeze(1)

    index = np.asarray(generated, dtype=np.int64)[:, None] + np.arange(width)  # the output token

    def draws(stream: int) -> torch.Tensor:  # slots past a row's draft + 1 are padding
        return torch.from_numpy(uniforms(seeds, index, stream)).to(device)

    residual = torch.where(has_draft.unsqueeze(-1), probs.scatter(-1, draft, 0.0), probs)
    cdf = residual.cumsum(-1, dtype=torch.float64)
    total = cdf[..., -1:]
    drawn = torch.searchsorted(cdf, draws(_DRAW).unsqueeze(-1) * total, right=True).clamp_(max=vocab - 1)
    # a parallel scan's last-bit rounding must not land a draw on a zero-probability token
    drawn = torch.where(residual.gather(-1, drawn) > 0, drawn, residual.argmax(-1, keepdim=True))
    p_draft = probs.gather(-1, draft).squeeze(-1).double()
    # nothing left to draw from: p(x) is 1 up to rounding, so x stays
    accepted = has_draft & (accepts(draws(_ACCEPT), p_draft) | (total.squeeze(-1) == 0))
    return torch.where(accepted, draft.squeeze(-1), drawn.squeeze(-1))
