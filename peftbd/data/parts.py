"""The generate stage's resumable work: parquet parts of an unfinished artifact, and the throughput
of the run that wrote them."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from peftbd.data.artifact import ARTIFACT_SCHEMA
from peftbd.manifest import WorkerPeaks

log = logging.getLogger(__name__)

WORK_SCHEMA = pa.schema(list(ARTIFACT_SCHEMA) + [
    pa.field("actor", pa.string()),  # which generation actor produced the row
    pa.field("batch_start", pa.float64()),  # unix time its batch started / ended generating
    pa.field("batch_end", pa.float64()),
    pa.field("batch_cpu_seconds", pa.float64()),  # CPU time the actor process spent on the batch
    pa.field("actor_rss_mib", pa.float64()),  # the actor's peak RSS after the batch
    pa.field("actor_gpu_mib", pa.float64()),  # the actor's peak GPU memory (null without a GPU)
    pa.field("actor_dtype", pa.string()),  # the dtype its verifier ran in
])
"""Rows of the resumable work parts: the artifact columns plus throughput bookkeeping."""


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

    def read_complete(self, splits: dict[str, str]) -> pa.Table:
        """All rows, one copy per id, after checking that they are exactly the planned ids (no
        gaps) with their planned splits. Identical copies of a row (two runs that generated the
        same block) are kept once; copies that differ fail, naming their ids."""
        table = self._one_copy_each(self.read())
        ids = table["id"].to_pylist()
        if set(ids) != splits.keys():
            missing, extra = len(splits.keys() - set(ids)), len(set(ids) - splits.keys())
            raise RuntimeError(
                f"work parts in {self.root} hold {len(ids)} rows but the plan has {len(splits)} "
                f"({missing} planned ids missing, {extra} not planned); delete {self.root} and rerun"
            )
        if any(splits[i] != s for i, s in zip(ids, table["split"].to_pylist())):
            raise RuntimeError(f"work parts in {self.root} disagree with the split plan; "
                               f"delete {self.root} and rerun")
        return table

    def _one_copy_each(self, table: pa.Table) -> pa.Table:
        """`table` with the first copy of each id; fails when copies differ in an artifact column."""
        counts = table.group_by("id").aggregate([("id", "count")])
        repeated = counts.filter(pc.greater(counts["id_count"], 1))["id"]
        if not len(repeated):
            return table
        copies: dict[str, list[dict[str, Any]]] = {}
        for row in table.filter(pc.is_in(table["id"], value_set=repeated)).select(
                ARTIFACT_SCHEMA.names).to_pylist():
            copies.setdefault(row["id"], []).append(row)
        conflicting = sorted(i for i, rows in copies.items() if any(r != rows[0] for r in rows))
        if conflicting:
            shown = ", ".join(conflicting[:10]) + (f" (+{len(conflicting) - 10} more)"
                                                   if len(conflicting) > 10 else "")
            raise RuntimeError(
                f"work parts in {self.root} hold differing copies of {len(conflicting)} row ids: "
                f"{shown}; the parts were made by different code or machines. Delete {self.root} "
                f"and rerun"
            )
        first = table.append_column("_row", pa.array(range(table.num_rows), pa.int64())).group_by(
            "id").aggregate([("_row", "min")])["_row_min"]
        log.warning("work parts in %s hold %d identical copies of %d ids (two runs made the same "
                    "rows); keeping one of each", self.root, table.num_rows - len(first), len(repeated))
        return table.take(first.sort())
    def remove(self) -> None:
        """Delete the work directory (after the artifact is finalized)."""
        shutil.rmtree(self.root, ignore_errors=True)


def actor_peaks(per_actor: dict[str, dict[str, Any]]) -> WorkerPeaks:
    """The actors' peaks (`throughput(...)["per_actor"]`) as the stage's `workers` section."""
    return WorkerPeaks.combine([WorkerPeaks(1, a["peak_rss_mib"], a["peak_gpu_mib"], a["dtype"])
                                for a in per_actor.values()])


def _per(tokens: int, seconds: float | None) -> float | None:
    return None if seconds is None else round(tokens / max(seconds, 1e-9), 1)


def throughput(table: pa.Table, stage_seconds: float) -> dict[str, Any]:
    """Tokens/s of the WORK_SCHEMA rows generated in one run: over the span from the first batch
    start to the last batch end (`tokens_per_s`), over the whole generation phase with actor
    start-up (`stage_tokens_per_s`), per CPU-second of the actors (`tokens_per_cpu_s`: the
    efficiency, insensitive to other load on a shared machine; None where an actor's CPU time was
    not measured), and per actor."""
    if table.num_rows == 0:
        return {"generated_rows": 0, "generated_tokens": 0}
    batches = table.group_by(["actor", "batch_start", "batch_end", "batch_cpu_seconds", "actor_dtype"]).aggregate([
        ("continuation_len", "sum"), ("id", "count"), ("actor_rss_mib", "max"), ("actor_gpu_mib", "max"),
    ]).to_pylist()
    per_actor: dict[str, dict[str, Any]] = {}
    for b in batches:
        a = per_actor.setdefault(b["actor"], {"rows": 0, "tokens": 0, "busy_seconds": 0.0,
                                              "cpu_seconds": 0.0, "batches": 0,
                                              "peak_rss_mib": None, "peak_gpu_mib": None,
                                              "dtype": b["actor_dtype"]})
        a["rows"] += b["id_count"]
        a["tokens"] += b["continuation_len_sum"]
        a["busy_seconds"] += b["batch_end"] - b["batch_start"]
        cpu = b["batch_cpu_seconds"]  # null: not measured (vLLM's engine runs in processes of its own)
        a["cpu_seconds"] = None if cpu is None or a["cpu_seconds"] is None else a["cpu_seconds"] + cpu
        a["batches"] += 1
        if b["actor_rss_mib_max"] is not None:
            a["peak_rss_mib"] = max(a["peak_rss_mib"] or 0.0, round(b["actor_rss_mib_max"], 1))
        if b["actor_gpu_mib_max"] is not None:
            a["peak_gpu_mib"] = max(a["peak_gpu_mib"] or 0.0, round(b["actor_gpu_mib_max"], 1))
    for a in per_actor.values():
        a["tokens_per_s"] = round(a["tokens"] / max(a["busy_seconds"], 1e-9), 1)
        a["tokens_per_cpu_s"] = _per(a["tokens"], a["cpu_seconds"])
        a["busy_seconds"] = round(a["busy_seconds"], 3)
        a["cpu_seconds"] = None if a["cpu_seconds"] is None else round(a["cpu_seconds"], 3)
    tokens = pc.sum(table["continuation_len"]).as_py()
    span = pc.max(table["batch_end"]).as_py() - pc.min(table["batch_start"]).as_py()
    cpus = [a["cpu_seconds"] for a in per_actor.values()]
    cpu = None if None in cpus else sum(cpus)
    return {
        "generated_rows": table.num_rows,
        "generated_tokens": tokens,
        "tokens_per_s": round(tokens / max(span, 1e-9), 1),
        "stage_tokens_per_s": round(tokens / max(stage_seconds, 1e-9), 1),
        "tokens_per_cpu_s": _per(tokens, cpu),
        "span_seconds": round(span, 3),
        "stage_seconds": round(stage_seconds, 3),
        "per_actor": per_actor,
    }
