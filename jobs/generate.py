"""Generate stage: the frozen verifier greedily continues every prompt -> the continuation artifact.

read (Ray Data) -> render + tokenize (tasks) -> split assignment (driver, by row-id hash) ->
batched greedy generation (`map_batches` over an actor pool, one verifier per actor) ->
parquet parts in `<out>.work/` (resumable) -> `<out>/{train,val,test}.parquet` + manifest.json.

    python -m jobs.generate --preset tiny --out outputs/generate
    python -m jobs.generate --preset tiny --source spec-bench:../shared/data/spec_bench/question.jsonl \
        --set data.train_size=0 --set data.val_size=0 --set data.test_size=480 --out outputs/specbench
    ray job submit --working-dir . -- python -m jobs.generate --preset tiny --out /abs/path
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray

from jobs.ray_env import init_ray
from peftbd.cli import add_config_args, config_from_args
from peftbd.config import Config
from peftbd.data.artifact import SPLITS, WORK_SCHEMA, PartStore, assign_splits, write_split
from peftbd.data.continuations import greedy_continuations
from peftbd.data.sources import (
    Source,
    SourceError,
    load_hub_dataset,
    prepare_records,
    resolve_source,
)
from peftbd.manifest import (
    StageTimer,
    atomic_output_dir,
    is_complete,
    peak_rss_mib,
    read_manifest,
    versions,
    write_manifest,
)
from peftbd.models.loading import ModelUnavailableError, eos_token_ids, load_tokenizer, load_verifier

log = logging.getLogger(__name__)

PREPARE_BATCH_ROWS = 512


def read_source(source: Source, cfg: Config, limit: int | None) -> ray.data.Dataset:
    """The raw records of `source` (JSON lines as `{"text": line}`), the first `limit` if given."""
    if source.kind == "hub":
        return ray.data.from_huggingface(load_hub_dataset(source, cfg.data.hub_split, limit))
    if source.kind == "parquet":
        ds = ray.data.read_parquet(source.location)
    else:
        ds = ray.data.read_text(source.location)
    if limit:
        ds = ds.limit(limit)
        ds.context.execution_options.preserve_order = True  # "first N" must be the file's first N
    return ds


@functools.lru_cache(maxsize=2)
def _tokenizer(cfg: Config) -> Any:
    return load_tokenizer(cfg)


def _prepare_batch(batch: pa.Table, cfg: Config, source: Source) -> pa.Table:
    return prepare_records(_tokenizer(cfg), source, batch.to_pylist(), cfg.data.max_prompt_len)


def prepare(source: Source, cfg: Config, limit: int | None) -> ray.data.Dataset:
    """Every record rendered and tokenized by Ray tasks (PREPARED_SCHEMA), materialized."""
    ds = read_source(source, cfg, limit).map_batches(
        _prepare_batch, fn_kwargs={"cfg": cfg, "source": source}, batch_format="pyarrow",
        batch_size=PREPARE_BATCH_ROWS,
    )
    try:
        return ds.materialize()
    except Exception as exc:
        raise SourceError(
            f"cannot read data.source={source.name!r} ({source.location}): "
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:500]}"
        ) from exc


@dataclasses.dataclass
class Plan:
    """Which rows to generate: `splits` (id -> split), rows read, dropped rows by reason."""

    splits: dict[str, str]
    rows_read: int
    usable: int
    dropped: Counter


def plan_splits(index: pa.Table, cfg: Config, source: Source) -> Plan:
    """Count dropped rows, drop every row of a duplicated id, and assign splits by id hash."""
    dropped: Counter = Counter(r for r in index["drop_reason"].to_pylist() if r is not None)
    ids = Counter(index.filter(pc.is_null(index["drop_reason"]))["id"].to_pylist())
    duplicated = sum(n for n in ids.values() if n > 1)
    if duplicated:
        dropped["duplicate_id"] += duplicated
    unique = [i for i, n in ids.items() if n == 1]
    d = cfg.data
    splits = assign_splits(unique, d.train_size, d.val_size, d.test_size, d.seed)
    if not splits:
        raise SourceError(
            f"data.source={source.name!r} yielded no usable prompts ({index.num_rows} rows read; "
            f"dropped: {dict(dropped) or 'none'}; split sizes {d.train_size}/{d.val_size}/"
            f"{d.test_size})"
        )
    return Plan(splits, index.num_rows, len(unique), dropped)


def _select(batch: pa.Table, splits: dict[str, str]) -> pa.Table:
    keep = [i for i, row_id in enumerate(batch["id"].to_pylist()) if row_id in splits]
    batch = batch.take(keep).drop_columns(["drop_reason"])
    return batch.append_column(
        "split", pa.array([splits[i] for i in batch["id"].to_pylist()], pa.string())
    )


class VerifierActor:
    """Ray Data callable class: loads the frozen verifier once, then greedily continues batches."""

    def __init__(self, cfg: Config) -> None:
        import torch

        torch.set_num_threads(max(1, int(cfg.generate.num_cpus_per_actor)))
        tokenizer = load_tokenizer(cfg)
        self.model = load_verifier(cfg)
        self.eos_ids = eos_token_ids(self.model, tokenizer)
        self.pad_id = tokenizer.pad_token_id
        self.max_new_tokens = cfg.data.max_new_tokens
        self.name = f"{os.uname().nodename}:{os.getpid()}"

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        start = time.time()
        outs = greedy_continuations(
            self.model, [r["prompt_ids"] for r in rows], self.max_new_tokens, self.eos_ids,
            self.pad_id,
        )
        bookkeeping = {"actor": self.name, "batch_start": start, "batch_end": time.time(),
                       "actor_rss_mib": peak_rss_mib()}
        return pa.Table.from_pylist([
            {**row, "continuation_ids": out.ids, "prompt_len": len(row["prompt_ids"]),
             "continuation_len": len(out.ids), "finish_reason": out.finish_reason, **bookkeeping}
            for row, out in zip(rows, outs)
        ], schema=WORK_SCHEMA)


def generate(prepared: ray.data.Dataset, todo: dict[str, str], cfg: Config) -> ray.data.Dataset:
    """The `todo` rows (id -> split) continued by an actor pool of verifiers."""
    g = cfg.generate
    ds = prepared.map_batches(_select, fn_kwargs={"splits": todo}, batch_format="pyarrow")
    # One block per batch: actors share the work evenly and each finished batch becomes a part.
    ds = ds.repartition(target_num_rows_per_block=g.batch_size, strict=True)
    ds.context.execution_options.preserve_order = False
    return ds.map_batches(
        VerifierActor, fn_constructor_kwargs={"cfg": cfg}, batch_format="pyarrow",
        batch_size=g.batch_size, compute=ray.data.ActorPoolStrategy(size=g.num_actors),
        num_cpus=g.num_cpus_per_actor, num_gpus=g.num_gpus_per_actor,
    )


def throughput(table: pa.Table, stage_seconds: float) -> dict[str, Any]:
    """Tokens/s of rows generated in this run: over the span from the first batch start to the
    last batch end, over the whole generation phase (actor start-up included), and per actor
    (tokens over the actor's busy time)."""
    if table.num_rows == 0:
        return {"generated_rows": 0, "generated_tokens": 0}
    batches = table.group_by(["actor", "batch_start", "batch_end"]).aggregate([
        ("continuation_len", "sum"), ("id", "count"), ("actor_rss_mib", "max"),
    ]).to_pylist()
    per_actor: dict[str, dict[str, float]] = {}
    for b in batches:
        a = per_actor.setdefault(b["actor"], {"rows": 0, "tokens": 0, "busy_seconds": 0.0,
                                              "batches": 0, "peak_rss_mib": 0.0})
        a["rows"] += b["id_count"]
        a["tokens"] += b["continuation_len_sum"]
        a["busy_seconds"] += b["batch_end"] - b["batch_start"]
        a["batches"] += 1
        a["peak_rss_mib"] = max(a["peak_rss_mib"], round(b["actor_rss_mib_max"], 1))
    for a in per_actor.values():
        a["tokens_per_s"] = round(a["tokens"] / max(a["busy_seconds"], 1e-9), 1)
        a["busy_seconds"] = round(a["busy_seconds"], 3)
    tokens = pc.sum(table["continuation_len"]).as_py()
    span = pc.max(table["batch_end"]).as_py() - pc.min(table["batch_start"]).as_py()
    return {
        "generated_rows": table.num_rows,
        "generated_tokens": tokens,
        "tokens_per_s": round(tokens / max(span, 1e-9), 1),
        "stage_tokens_per_s": round(tokens / max(stage_seconds, 1e-9), 1),
        "span_seconds": round(span, 3),
        "stage_seconds": round(stage_seconds, 3),
        "per_actor": per_actor,
    }


def fingerprint(cfg: Config, limit: int | None) -> str:
    """Hash of everything that decides the artifact's rows (not actors or batch size)."""
    payload = {"model": dataclasses.asdict(cfg.model), "data": dataclasses.asdict(cfg.data),
               "tiny_world": dataclasses.asdict(cfg.tiny_world), "limit": limit}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _check_rows(table: pa.Table, splits: dict[str, str]) -> None:
    ids = table["id"].to_pylist()
    if len(ids) != len(set(ids)) or set(ids) != set(splits):
        raise RuntimeError(
            f"work parts hold {len(ids)} rows ({len(set(ids))} distinct) but the plan has "
            f"{len(splits)}; delete the work directory and rerun"
        )


def run_generate(
    cfg: Config, out_dir: str | Path, source: str | None = None, limit: int | None = None
) -> Path:
    """Build (or complete, after an interruption) the continuation artifact in `out_dir`.

    `source` overrides `cfg.data.source`; `limit` reads only the first `limit` source rows. Joins
    the running Ray (or starts a local one). Returns `out_dir`.
    """
    timer = StageTimer()
    out_dir = Path(out_dir)
    if source:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source=source))
    fp = fingerprint(cfg, limit)
    if is_complete(out_dir) and read_manifest(out_dir).get("fingerprint") == fp:
        log.info("generate: %s is already complete for this config", out_dir)
        return out_dir
    src = resolve_source(cfg)
    init_ray()
    prepared = prepare(src, cfg, limit)
    index = pa.concat_tables(ray.get(prepared.select_columns(["id", "drop_reason"]).to_arrow_refs()))
    plan = plan_splits(index, cfg, src)

    store = PartStore(out_dir.with_name(out_dir.name + ".work"), fp)
    done = store.done_ids() & plan.splits.keys()
    todo = {i: s for i, s in plan.splits.items() if i not in done}
    log.info("generate: %d rows planned, %d already done, %d to generate",
             len(plan.splits), len(done), len(todo))
    new_parts: list[Path] = []
    gen_start = time.perf_counter()
    if todo:
        for block in generate(prepared, todo, cfg).iter_batches(batch_size=None,
                                                                 batch_format="pyarrow"):
            if block.num_rows:
                new_parts.append(store.write(block))
    gen_seconds = time.perf_counter() - gen_start

    table = store.read()
    _check_rows(table, plan.splits)
    manifest = {
        "stage": "generate",
        "fingerprint": fp,
        "source": dataclasses.asdict(src),
        "limit": limit,
        "counts": {
            "rows_read": plan.rows_read,
            "usable": plan.usable,
            "unused": plan.usable - len(plan.splits),
            "per_split": {s: int(pc.sum(pc.equal(table["split"], s)).as_py() or 0) for s in SPLITS},
            "finish_reason": dict(Counter(table["finish_reason"].to_pylist())),
            "prompt_tokens": pc.sum(table["prompt_len"]).as_py(),
            "continuation_tokens": pc.sum(table["continuation_len"]).as_py(),
            "resumed_rows": len(done),
        },
        "dropped": dict(sorted(plan.dropped.items())),
        "throughput": throughput(store.read(new_parts), gen_seconds),
        "config": cfg.to_dict(),
        "versions": versions(),
    }
    with atomic_output_dir(out_dir) as tmp:
        for split in SPLITS:
            write_split(tmp, split, table.filter(pc.equal(table["split"], split)))
        write_manifest(tmp, {**manifest, **timer.stats()})
    store.remove()
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.generate",
        description="Greedy verifier continuations of every prompt -> the continuation artifact.",
    )
    add_config_args(parser)
    parser.add_argument(
        "--source", default=None,
        help="prompt source, overriding data.source: embedded:tiny, a TULU-3-schema .jsonl/.parquet "
        "file or directory, a hub dataset id, or spec-bench:PATH/question.jsonl",
    )
    parser.add_argument("--limit", type=int, default=None, help="read only the first N source rows")
    parser.add_argument("--out", default=None, help="artifact directory (default: <paths.out_dir>/generate)")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    out = Path(args.out) if args.out else Path(cfg.paths.out_dir) / "generate"
    try:
        run_generate(cfg, out, source=args.source, limit=args.limit)
    except (SourceError, ModelUnavailableError) as exc:
        sys.exit(f"error: {exc}")
    m = read_manifest(out)
    print(f"generate artifact: {out.resolve()} (rows per split {m['counts']['per_split']}, "
          f"dropped {m['dropped']}, {m['throughput'].get('tokens_per_s', 0)} tokens/s)")


if __name__ == "__main__":
    # Run from the importable module, so Ray pickles `jobs.generate.*` by reference, not `__main__`.
    from jobs.generate import main as _main

    _main()
