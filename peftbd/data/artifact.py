"""The continuation artifact: one declared parquet schema, deterministic splits, and its reader.

Layout of an artifact directory (written by `jobs/generate.py`, read by the training and benchmark
stages):

```
<artifact>/train.parquet   rows of ARTIFACT_SCHEMA with split == "train"
<artifact>/val.parquet
<artifact>/test.parquet
<artifact>/manifest.json   config, versions, counts per split, dropped rows by reason, tokens/s
```
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from peftbd.errors import UserError
from peftbd.manifest import is_complete

SPLITS = ("train", "val", "test")
FINISH_REASONS = ("eos", "length")

ARTIFACT_SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("continuation_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("prompt_len", pa.int32(), nullable=False),
    pa.field("continuation_len", pa.int32(), nullable=False),
    pa.field("finish_reason", pa.string(), nullable=False),  # eos | length
    pa.field("category", pa.string(), nullable=True),  # Spec-Bench category; null elsewhere
])
"""Every row of every split file; `prompt_ids + continuation_ids` is the verifier's greedy text."""


class ArtifactError(UserError, ValueError):
    """An artifact directory or split file is missing or does not match `ARTIFACT_SCHEMA`."""


def split_path(artifact_dir: str | Path, split: str) -> Path:
    """The parquet file of one split."""
    if split not in SPLITS:
        raise ArtifactError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    return Path(artifact_dir) / f"{split}.parquet"


def to_artifact_table(table: pa.Table) -> pa.Table:
    """`table`'s ARTIFACT_SCHEMA columns, in schema order and cast to the declared types."""
    missing = [name for name in ARTIFACT_SCHEMA.names if name not in table.column_names]
    if missing:
        raise ArtifactError(
            f"missing column(s) {', '.join(missing)}; an artifact table needs "
            f"{', '.join(ARTIFACT_SCHEMA.names)}"
        )
    try:
        return table.select(ARTIFACT_SCHEMA.names).cast(ARTIFACT_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ArtifactError(f"columns do not cast to the artifact schema: {exc}") from exc


def write_split(artifact_dir: str | Path, split: str, table: pa.Table) -> Path:
    """Write one split file (rows sorted by id) after checking every row belongs to `split`."""
    table = to_artifact_table(table)
    other = set(table.column("split").to_pylist()) - {split}
    if other:
        raise ArtifactError(f"rows of split(s) {sorted(other)} passed to write_split({split!r})")
    path = split_path(artifact_dir, split)
    pq.write_table(table.sort_by("id"), path)
    return path


def read_split(artifact_dir: str | Path, split: str) -> pa.Table:
    """One split of a finished artifact as a table with exactly ARTIFACT_SCHEMA.

    Fails with `ArtifactError` naming the problem: an unfinished or missing artifact, a missing
    split file, or missing columns.
    """
    artifact_dir = Path(artifact_dir)
    path = split_path(artifact_dir, split)
    if not is_complete(artifact_dir):
        raise ArtifactError(
            f"{str(artifact_dir)!r} is not a finished generate artifact (no manifest.json); "
            f"build it with `python -m jobs.generate --out {artifact_dir}`"
        )
    if not path.is_file():
        raise ArtifactError(f"artifact {str(artifact_dir)!r} has no {split} split ({path.name})")
    table = pq.read_table(path)
    try:
        return to_artifact_table(table)
    except ArtifactError as exc:
        raise ArtifactError(f"{path}: {exc}") from exc


def split_key(row_id: str, seed: int) -> str:
    """The hash that orders rows for split assignment (stable across runs and machines)."""
    return hashlib.sha256(f"{seed}:{row_id}".encode()).hexdigest()


def split_sizes(available: int, train: int, val: int, test: int) -> dict[str, int]:
    """How many rows each split gets: the requested sizes when `available` covers them, else the
    requested proportions of `available` (val and test keep at least one row each if requested)."""
    want = {"train": train, "val": val, "test": test}
    total = sum(want.values())
    if available >= total:
        return want
    if total == 0:
        return {s: 0 for s in SPLITS}
    val_n = max(1, round(available * val / total)) if val else 0
    test_n = max(1, round(available * test / total)) if test else 0
    val_n, test_n = min(val_n, available), min(test_n, max(0, available - val_n))
    train_n = available - val_n - test_n if train else 0
    return {"train": train_n, "val": val_n, "test": test_n}


def balanced(total: int, available: Mapping[str | None, int]) -> dict[str | None, int]:
    """`total` rows shared as equally as `available` (rows per stratum) allows: round-robin over
    the strata that have rows left, in sorted order (None first)."""
    share = dict.fromkeys(available, 0)
    order = sorted(available, key=lambda c: (c is not None, c or ""))
    while total > 0:
        open_ = [c for c in order if share[c] < available[c]]
        if not open_:
            break
        for c in open_[:total]:
            share[c] += 1
        total -= min(total, len(open_))
    return share


def assign_splits(
    row_ids: Iterable[str], train: int, val: int, test: int, seed: int,
    categories: Mapping[str, str | None] | None = None,
) -> dict[str, str]:
    """Map row id -> split, deterministically from the ids, stratified by `categories` (id ->
    category; rows without one form one stratum): rows sorted by `split_key`; val, then test,
    take the first rows of each category, as many per category as `balanced` gives (equal
    shares: a held-out set weighs every category alike); train takes the next rows over all
    categories (sizes from `split_sizes`); the rest are unused."""
    ids = sorted(set(row_ids), key=lambda i: split_key(i, seed))
    sizes = split_sizes(len(ids), train, val, test)
    strata: dict[str | None, list[str]] = {}
    for row_id in ids:
        strata.setdefault((categories or {}).get(row_id), []).append(row_id)
    out: dict[str, str] = {}
    for split in ("val", "test"):
        share = balanced(sizes[split], {c: len(rows) for c, rows in strata.items()})
        for c, rows in strata.items():
            out.update(dict.fromkeys(rows[: share[c]], split))
            strata[c] = rows[share[c]:]
    rest = [row_id for row_id in ids if row_id not in out]
    out.update(dict.fromkeys(rest[: sizes["train"]], "train"))
    return out


@dataclass(frozen=True)
class SplitPlan:
    """Which rows an artifact holds: `splits` (id -> split), and what was left out and why."""

    splits: dict[str, str]
    rows_read: int
    usable: int
    dropped: dict[str, int]


def plan_splits(
    ids: Sequence[str | None], drop_reasons: Sequence[str | None],
    train: int, val: int, test: int, seed: int, categories: Sequence[str | None] | None = None,
) -> SplitPlan:
    """Count dropped rows by reason, drop every row of a duplicated id (`duplicate_id`), and
    assign the rest with `assign_splits`, stratified by `categories` (one per row, or none)."""
    dropped = Counter(r for r in drop_reasons if r is not None)
    counts: Counter[str] = Counter()
    for i, r in zip(ids, drop_reasons):
        if r is None:
            assert i is not None, "only a dropped row lacks an id (PREPARED_SCHEMA)"
            counts[i] += 1
    duplicated = sum(n for n in counts.values() if n > 1)
    if duplicated:
        dropped["duplicate_id"] += duplicated
    unique = [i for i, n in counts.items() if n == 1]
    category_of = (None if categories is None
                   else {i: c for i, c in zip(ids, categories) if i is not None})
    splits = assign_splits(unique, train, val, test, seed, category_of)
    return SplitPlan(splits, len(ids), len(unique), dict(sorted(dropped.items())))
