"""Training examples from the continuation artifact: validation, counts, a seeded order, batches.

One training example is one artifact row: the token sequence `prompt_ids + continuation_ids`
and its prompt length. Both objectives read whole sequences (the block-diffusion objective cuts
the continuation into blocks itself, see `peftbd.training.block_diffusion`).

Rows with an empty continuation carry no training signal for either drafter and are skipped;
`SplitCounts` records how many, so the manifest shows it. An empty split (or one left empty by
the skip) is an error that names the artifact and the fix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from peftbd.data.artifact import ArtifactError, read_split, split_key

COLUMNS = ("id", "prompt_ids", "continuation_ids", "prompt_len", "continuation_len")
"""The artifact columns the training stages read."""


@dataclass(frozen=True)
class SplitCounts:
    """What one split holds for training; `blocks` and `padded_blocks` use block size D (None
    for a drafter without blocks)."""

    rows: int
    skipped_empty_continuation: int
    continuation_tokens: int
    blocks: int | None
    padded_blocks: int | None

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def load_training_split(
    artifact_dir: str | Path, split: str, block_size: int | None, seed: int,
    allow_empty: bool = False,
) -> tuple[pa.Table, SplitCounts]:
    """The usable rows of one split (columns `COLUMNS`) in a seeded order, and their counts.

    Rows are ordered by `split_key(id, seed)`, a stable hash, so the order is the same on every
    run and machine. Raises `ArtifactError` for a missing artifact/split/column or an empty split
    (unless `allow_empty`: a drafter published untrained on purpose, `peftbd.untrained`).
    """
    table = read_split(artifact_dir, split)
    usable = table.filter(pc.greater(table["continuation_len"], 0))
    if usable.num_rows == 0 and not allow_empty:
        raise ArtifactError(
            f"split {split!r} of {str(artifact_dir)!r} has no row with a non-empty continuation "
            f"({table.num_rows} rows in the file); regenerate the artifact with more rows "
            f"(e.g. `python -m jobs.generate --set data.{split}_size=...`)"
            + (", or set training.allow_untrained=true to publish the drafter untrained on purpose"
               if split == "train" else "")
        )
    keys = [split_key(i, seed) for i in usable["id"].to_pylist()]
    usable = usable.take(np.argsort(np.array(keys), kind="stable")).select(list(COLUMNS))
    lengths = np.asarray(usable["continuation_len"], dtype=np.int64)
    counts = SplitCounts(
        rows=usable.num_rows,
        skipped_empty_continuation=table.num_rows - usable.num_rows,
        continuation_tokens=int(lengths.sum()),
        blocks=int((-(-lengths // block_size)).sum()) if block_size else None,
        padded_blocks=int((lengths % block_size != 0).sum()) if block_size else None,
    )
    return usable, counts


@dataclass(frozen=True)
class SequenceBatch:
    """Right-padded token sequences; `lengths[b]` real tokens, the first `prompt_lens[b]` prompt."""

    ids: torch.Tensor  # long (B, L)
    lengths: torch.Tensor  # long (B,)
    prompt_lens: torch.Tensor  # long (B,)
    row_ids: list[str]

    def to(self, device: torch.device) -> SequenceBatch:
        return dataclasses.replace(
            self, ids=self.ids.to(device), lengths=self.lengths.to(device),
            prompt_lens=self.prompt_lens.to(device),
        )


def collate_sequences(batch: dict[str, Any], pad_id: int) -> SequenceBatch:
    """A `SequenceBatch` from a columnar batch of artifact rows (numpy or lists, as Ray Data or
    `pa.Table.to_pydict` give them)."""
    seqs = [
        np.concatenate([np.asarray(p, dtype=np.int64), np.asarray(c, dtype=np.int64)])
        for p, c in zip(batch["prompt_ids"], batch["continuation_ids"], strict=True)
    ]
    prompt_lens = [int(x) for x in batch["prompt_len"]]
    if any(p < 1 for p in prompt_lens):
        raise ArtifactError(f"prompt_len must be >= 1 (got {min(prompt_lens)}): a draft needs a "
                            "last prompt token to start from")
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.from_numpy(s)
    return SequenceBatch(
        ids=ids,
        lengths=torch.tensor([len(s) for s in seqs], dtype=torch.long),
        prompt_lens=torch.tensor(prompt_lens, dtype=torch.long),
        row_ids=[str(x) for x in batch["id"]],
    )
