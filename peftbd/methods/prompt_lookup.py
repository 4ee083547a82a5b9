"""Prompt lookup (vLLM's `ngram` proposer, HF's `prompt_lookup_num_tokens`), the whole method in
one file: a model-free drafter that proposes the tokens which followed an earlier occurrence of
the context's last n-gram. Nothing to train and nothing to load: it reads only the request's
tokens, so a split Drafter catches a request up by committing them and its Verifier ships it
nothing. The reference drafter of text the prompt already holds (the tiny world's grounded
category: a passage copied or quoted from the prompt).

Each round, per request, over `state.tokens` (prompt + committed output): find the longest suffix
n-gram, n from `max_ngram` down to `min_ngram`, that also occurs earlier in the context (an
occurrence may overlap the suffix, as in vLLM, but must end before the last token so that at
least one token follows it), and propose the up-to-k tokens that followed that occurrence,
k = min(num_tokens, max_tokens[i]); fewer when the context ends first. No such n-gram: an empty
(1, 0) draft, so the round is one verifier step (an AR step).

Which occurrence (`occurrence`): vLLM v1 (`vllm/v1/spec_decode/ngram_proposer.py`) and HF both
take the earliest one (`earliest`: the peer table sets it, so that vLLM's `ngram` and this drafter
propose the same drafts). By default (`recent`) it is the most recent occurrence whose
continuation holds all k tokens; only
when every occurrence's continuation is cut short by the end of the context, the one with the
longest continuation (which is the earliest). Why: the most recent occurrence reflects what the
request is doing now (a passage the output is copying, the latest revision of an edited line),
where the earliest may be from an unrelated part of a long prompt; but in a periodic stretch (a
loop, a list) the most recent occurrences sit right before the suffix and could offer only a
token or two, where an earlier one offers the full k tokens of the same period.

The search is vectorised with numpy over the token array: one comparison over all positions for
the last token, then one over the surviving candidates per further n-gram length (a Python loop
over n <= max_ngram, never over positions). It reads no verifier state: no KV, no hidden states,
no features, and holds nothing per request (`state.drafter_state` stays None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from peftbd.config_sections import Config, PositiveInt
from peftbd.decoding.state import DecodeState, timed
from peftbd.methods.arm import ArmSpec
from peftbd.methods.registry import DraftContext, Method, register

ID = "prompt_lookup"
Occurrence = Literal["recent", "earliest"]
DEFAULTS = {
    "num_tokens": 8,  # draft tokens a round at most (vLLM's num_speculative_tokens)
    "min_ngram": 2,  # the shortest suffix n-gram that may match (vLLM's prompt_lookup_min)
    "max_ngram": 4,  # the longest, tried first (vLLM's prompt_lookup_max)
    "occurrence": "recent",  # which earlier occurrence: recent (see above) | earliest (vLLM's)
}
"""The section's values; a preset, a YAML file or --set changes any."""


@dataclass(frozen=True)
class PromptLookupConfig:
    """The section `prompt_lookup`: how many tokens a round drafts and which n-grams match."""

    num_tokens: PositiveInt
    min_ngram: PositiveInt
    max_ngram: PositiveInt
    occurrence: Occurrence

    ORDERED: ClassVar[tuple[tuple[str, str], ...]] = (("min_ngram", "max_ngram"),)


def prompt_lookup(tokens: Sequence[int] | npt.NDArray[np.int64], k: int, min_ngram: int,
                  max_ngram: int, occurrence: Occurrence = "recent") -> npt.NDArray[np.int64]:
    """The up-to-`k` tokens that followed the chosen earlier occurrence of the longest suffix
    n-gram of `tokens` (min_ngram <= n <= max_ngram), as a 1-D int64 array; empty when no such
    n-gram occurs earlier or `k` <= 0. The occurrence rules are the module docstring's."""
    ids = np.asarray(tokens, dtype=np.int64)
    length = int(ids.shape[0])
    empty = np.empty(0, dtype=np.int64)
    if k <= 0 or length < min_ngram + 1:
        return empty
    # ends: indices e <= length - 2 of the last token of an earlier occurrence of the suffix
    # n-gram (ids[e - n + 1 : e + 1] == ids[length - n :]), each followed by ids[e + 1]
    ends = np.flatnonzero(ids[:-1] == ids[-1])
    n = 1
    while n < max_ngram and ends.size:
        longer = ends[ends >= n]  # those with room for one more token before them
        if longer.size == 0:
            break
        longer = longer[ids[longer - n] == ids[length - 1 - n]]
        if longer.size == 0:
            break
        ends, n = longer, n + 1
    if ends.size == 0 or n < min_ngram:
        return empty
    full = ends[length - 1 - ends >= k]  # continuations not cut short by the context's end
    end = int(full[-1]) if full.size and occurrence == "recent" else int(ends[0])
    return ids[end + 1 : end + 1 + k].copy()


class PromptLookupDrafter:
    """Model-free prompt-lookup drafter: up to `num_tokens` draft tokens per round, copied from
    after the longest earlier occurrence (n-gram of `min_ngram`..`max_ngram` tokens) of the
    context's suffix (vLLM's `num_speculative_tokens`, `prompt_lookup_min`, `prompt_lookup_max`).
    Greedy output is exact whatever it proposes; its speed-up comes from contexts that repeat
    themselves (copying, editing, quoting, retrieval), and a round without a match costs one
    verifier step, as AR's."""

    name = "prompt lookup drafter"
    reads_kv_layers: int | None = 0  # model-free: never reads the verifier's KV
    reads_hidden = False
    feature_layers: tuple[int, ...] = ()
    draft_forward = False  # nor runs a model: no draft forward

    def __init__(self, num_tokens: int, min_ngram: int, max_ngram: int,
                 occurrence: Occurrence = "recent") -> None:
        if num_tokens < 1:
            raise ValueError(f"PromptLookupDrafter: num_tokens={num_tokens}; it must be >= 1 "
                             "(the most draft tokens per round)")
        if min_ngram < 1:
            raise ValueError(f"PromptLookupDrafter: min_ngram={min_ngram}; it must be >= 1 "
                             "(the shortest suffix n-gram to look up)")
        if max_ngram < min_ngram:
            raise ValueError(f"PromptLookupDrafter: max_ngram={max_ngram} < min_ngram={min_ngram}; "
                             "max_ngram must be >= min_ngram")
        self.num_tokens = num_tokens
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.occurrence = occurrence

    def start(self, state: DecodeState) -> None:
        state.drafter_state = None  # nothing per request: each round searches state.tokens

    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        if len(states) != len(max_tokens):
            raise ValueError(f"propose got {len(states)} states but {len(max_tokens)} max_tokens")
        if not states:
            return []
        with timed(states, "draft"):
            return [
                torch.as_tensor(
                    prompt_lookup(state.tokens, min(self.num_tokens, m), self.min_ngram,
                                  self.max_ngram, self.occurrence),
                    dtype=torch.long, device=state.device,
                ).reshape(1, -1)
                for state, m in zip(states, max_tokens)
            ]


def arms(cfg: Config) -> list[ArmSpec]:
    s = cfg.prompt_lookup
    return [ArmSpec(ID, f"Prompt lookup ({s.num_tokens} tokens, n-grams {s.min_ngram}-{s.max_ngram})", ID)]


def drafter(module: nn.Module, ctx: DraftContext, spec: ArmSpec) -> PromptLookupDrafter:
    s = ctx.cfg.prompt_lookup
    return PromptLookupDrafter(s.num_tokens, s.min_ngram, s.max_ngram, s.occurrence)


METHOD = register(Method(
    id=ID, label="Prompt lookup", what="prompt-lookup drafter", config=PromptLookupConfig,
    defaults=DEFAULTS, arms=arms,
    positions=lambda cfg: cfg.prompt_lookup.num_tokens, drafter=drafter,
))
