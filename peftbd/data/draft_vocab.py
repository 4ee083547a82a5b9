"""The draft vocabulary of a compressed draft LM head (FR-Spec): the artifact's most frequent
continuation tokens.

FR-Spec restricts the drafter's LM head to the N tokens that make up most generated text; the
verifier still scores the whole vocabulary, so outputs stay exact, and a draft token outside the
N is simply never proposed. The frequencies are counted over the train split's continuations (the
verifier's own greedy replies), ties broken by the smaller id, so the set is a pure function of
the artifact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from peftbd.data.artifact import read_split


@dataclass(frozen=True)
class DraftVocabulary:
    """The N most frequent token ids, most frequent first, and the share of the counted
    continuation tokens they cover."""

    ids: list[int]
    coverage: float


def draft_vocabulary(artifact_dir: str | Path, size: int, vocab_size: int) -> DraftVocabulary:
    """The `size` most frequent continuation tokens of the train split of `artifact_dir` (all of
    `vocab_size` when it is smaller; see module doc)."""
    if size < 1:
        raise ValueError(f"peftbd_head.draft_vocab={size}: a draft vocabulary needs >= 1 token (0 = none)")
    tokens = pc.list_flatten(read_split(artifact_dir, "train")["continuation_ids"]).to_numpy()
    counts = np.bincount(tokens, minlength=vocab_size)
    order = np.lexsort((np.arange(counts.size), -counts))[: min(size, vocab_size)]
    return DraftVocabulary([int(i) for i in order], float(counts[order].sum() / max(tokens.size, 1)))
