"""The greedy audit: speculative output must equal greedy AR output token for token.

On a mismatch it reports the prompt id, the first divergent position and the verifier's top-2
logit margin there (from a fresh, cache-free forward): a margin near 0 means a numerical near-tie
(e.g. bf16 on GPU, different kernel shapes), a clear margin means a bug.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from peftbd.decoding.drafter import Drafter
from peftbd.decoding.loop import SpeculativeDecoder
from peftbd.decoding.verify import model_device, unwrap


@dataclass(frozen=True)
class Mismatch:
    """Where a speculative output first leaves the AR output (a token is None past an output's end)."""

    prompt_id: str
    position: int
    ar_token: int | None
    spec_token: int | None
    top2_margin: float


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where `a` and `b` differ (or the shorter length), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def top2_margin(model: torch.nn.Module, ids: Sequence[int]) -> float:
    """Verifier logit gap between its best and second-best next token after `ids`."""
    base = unwrap(model)
    x = torch.tensor([list(ids)], device=model_device(base))
    top = base(input_ids=x).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def compare(model: torch.nn.Module, prompt_id: str, prompt_ids: Sequence[int],
            ar_tokens: Sequence[int], spec_tokens: Sequence[int]) -> Mismatch | None:
    """None when the outputs are equal, else where and how close the verifier's call was."""
    pos = first_divergence(ar_tokens, spec_tokens)
    if pos is None:
        return None
    return Mismatch(
        prompt_id=prompt_id, position=pos,
        ar_token=ar_tokens[pos] if pos < len(ar_tokens) else None,
        spec_token=spec_tokens[pos] if pos < len(spec_tokens) else None,
        top2_margin=top2_margin(model, [*prompt_ids, *ar_tokens[:pos]]),
    )


def audit_summary(prompts: int, mismatches: Sequence[Mismatch]) -> dict[str, Any]:
    """{"prompts", "exact", "exact_pct", "mismatches": [...]} for manifests and reports."""
    exact = prompts - len(mismatches)
    return {
        "prompts": prompts, "exact": exact,
        "exact_pct": 100.0 * exact / prompts if prompts else None,
        "mismatches": [asdict(m) for m in mismatches],
    }


def greedy_audit(model: torch.nn.Module, prompts: Sequence[tuple[str, Sequence[int]]],
                 drafter: Drafter, max_new_tokens: int, eos_ids: Sequence[int] = ()) -> dict[str, Any]:
    """Decode each (id, prompt ids) greedily with and without `drafter` and compare."""
    ar = SpeculativeDecoder(model, None, eos_ids, max_new_tokens)
    spec = SpeculativeDecoder(model, drafter, eos_ids, max_new_tokens)
    mismatches = []
    for prompt_id, ids in prompts:
        found = compare(model, prompt_id, ids, ar.decode(ids).tokens, spec.decode(ids).tokens)
        if found is not None:
            mismatches.append(found)
    return audit_summary(len(prompts), mismatches)
