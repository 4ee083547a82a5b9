"""Drafting ahead (SSD / Saguaro, PEARL): while the verifier checks round r, the drafter drafts
round r+1 for a guessed outcome of round r, and round r+1 uses that pre-draft when the guess holds.

The guess is how many leading draft tokens round r accepts (`likeliest`: the request's most
frequent accepted length so far). The drafter drafts after them without the verifier's state of
those tokens (it arrives only with round r's verify) and without the bonus (the verifier's token
after them, unknown until then): a drafter that can do that in about one draft forward
implements `propose_ahead` (`drafts_ahead`), and its pre-draft continues whatever bonus the
verifier picks, so it is used whenever the verify accepts exactly the guessed length.

- PEFT-BD (`PeftBDDrafter.propose_ahead`): one adapter-on forward over
  `[t, d_1..d_k, m_0, m_1..m_{D-1}]`, the last committed token and the guessed accepted tokens
  inside the chunk (adapter-on KV in place of the verifier's), a mask where the bonus goes; the
  masks after it are the D - 1 token pre-draft, predicted in parallel as a block draft's later
  positions always are.
- Controlled acceptance (`peftbd.decoding.controlled`) wraps it: real forwards, scripted tokens.

Drafters that read the verifier's hidden states or features of the guessed positions (FastMTP,
the heads) would need a catch-up forward of about one verify first, so a pre-draft would finish
no sooner than the ordinary draft after the verify: they do not draft ahead. Exactness never
depends on the guess: a pre-draft is verified like any draft.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from peftbd.decoding.drafter import Drafter
from peftbd.models.peft_bd import draft_visibility


@dataclass(frozen=True)
class PreDraft:
    """A drafter's round r+1 for the outcome "`accepted` draft tokens of round r": `draft`
    (1, k) continues the committed tokens + those + the bonus, whichever it is."""

    accepted: int
    draft: torch.Tensor


def drafts_ahead(drafter: Drafter) -> bool:
    """Whether `drafter` can draft a round ahead: it has `propose_ahead(states, drafts,
    accepted, max_tokens) -> list[PreDraft]` (and so does the drafter it wraps, if any)."""
    inner = getattr(drafter, "inner", None)
    return callable(getattr(drafter, "propose_ahead", None)) and (inner is None or drafts_ahead(inner))


def likeliest(history: Sequence[int], proposed: int) -> int:
    """The guessed accepted length of a round proposing `proposed` tokens: the most frequent
    accepted length among the request's rounds so far (`history`; ties: the shorter; none yet:
    0), at most `proposed`."""
    if not history:
        return 0
    counts = collections.Counter(min(a, proposed) for a in history)
    return max(sorted(counts), key=counts.__getitem__)


def ahead_pattern(clean: int, block_size: int, anchored: bool, device: torch.device) -> torch.Tensor:
    """Bool (clean + block_size, same): who attends whom in a pre-draft chunk of `clean` known
    tokens (the last one is the anchor, PEFT-BD's `b`) then `block_size` masks: the known tokens
    causally, the anchor and masks as a draft does (`draft_visibility`), seeing every known one."""
    width = clean + block_size
    pattern = torch.zeros(width, width, dtype=torch.bool, device=device)
    pattern[: clean - 1, : clean - 1] = torch.ones(clean - 1, clean - 1, dtype=torch.bool,
                                                   device=device).tril()
    pattern[clean - 1 :] = draft_visibility(clean - 1, block_size, anchored, device)
    return pattern
