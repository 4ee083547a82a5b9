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
import json
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from peftbd.manifest import is_complete

log = logging.getLogger(__name__)

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

WORK_SCHEMA = pa.schema(list(ARTIFACT_SCHEMA) + [
    pa.field("actor", pa.string()),  # which generation actor produced the row
    pa.field("batch_start", pa.float64()),  # unix time its batch started / ended generating
    pa.field("batch_end", pa.float64()),
    pa.field("actor_rss_mib", pa.float64()),  # the actor's peak RSS after the batch
])
"""Rows of the resumable work parts: the artifact columns plus throughput bookkeeping."""


class ArtifactError(ValueError):
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


def assign_splits(
    row_ids: Iterable[str], train: int, val: int, test: int, seed: int
) -> dict[str, str]:
    """Map row id -> split, deterministically from the ids: rows sorted by `split_key`, the first
    go to val, the next to test, the next to train (sizes from `split_sizes`); the rest are unused.
    """
    ids = sorted(set(row_ids), key=lambda i: split_key(i, seed))
    sizes = split_sizes(len(ids), train, val, test)
    out: dict[str, str] = {}
    start = 0
    for split in ("val", "test", "train"):
        for row_id in ids[start : start + sizes[split]]:
            out[row_id] = split
        start += sizes[split]
    return out


class PartStore:
    """Parquet parts of an unfinished artifact, one per generated block, in a work directory.

    Each part is written to a temporary name and renamed, so a killed run leaves only whole parts;
    a rerun reads the ids already written and generates the rest. `fingerprint` identifies the
    run's inputs (config, source): parts of a different fingerprint are discarded.
    """

    PLAN = "plan.json"

    def __init__(self, root: str | Path, fingerprint: str) -> None:
        self.root = Path(root)
        plan = self.root / self.PLAN
        if plan.is_file() and json.loads(plan.read_text()).get("fingerprint") != fingerprint:
            log.warning("discarding work parts in %s: they were made for other inputs", self.root)
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        plan.write_text(json.dumps({"fingerprint": fingerprint}))
        for tmp in self.root.glob("*.tmp"):
            tmp.unlink()

    def parts(self) -> list[Path]:
        """Finished part files, in name order."""
        return sorted(self.root.glob("part-*.parquet"))

    def done_ids(self) -> set[str]:
        """Ids of every row already written."""
        return {i for p in self.parts() for i in pq.read_table(p, columns=["id"])["id"].to_pylist()}

    def write(self, table: pa.Table) -> Path:
        """Write one block of WORK_SCHEMA rows as a part named by its ids (atomic)."""
        table = table.select(WORK_SCHEMA.names).cast(WORK_SCHEMA)
        digest = hashlib.sha256("\n".join(sorted(table["id"].to_pylist())).encode()).hexdigest()
        path = self.root / f"part-{digest[:20]}.parquet"
        tmp = path.with_suffix(".tmp")
        pq.write_table(table, tmp)
        tmp.replace(path)
        return path

    def read(self, parts: Iterable[Path] | None = None) -> pa.Table:
        """The rows of `parts` (default: all) as one WORK_SCHEMA table."""
        tables = [pq.read_table(p) for p in (self.parts() if parts is None else parts)]
        return pa.concat_tables(tables) if tables else WORK_SCHEMA.empty_table()

    def remove(self) -> None:
        """Delete the work directory (after the artifact is finalized)."""
        shutil.rmtree(self.root, ignore_errors=True)
