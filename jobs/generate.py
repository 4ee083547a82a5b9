"""Generate stage: the frozen verifier greedily continues every prompt -> the continuation artifact.

read (Ray Data) -> render + tokenize (tasks) -> split assignment (driver, by row-id hash) ->
batched greedy generation (`map_batches` over an actor pool, one verifier per actor) ->
parquet parts in `<out>.work/` (resumable) -> `<out>/{train,val,test}.parquet` + manifest.json.

    python -m jobs.generate --preset tiny --out outputs/tiny/continuations
    python -m jobs.generate --preset tiny --source spec-bench:../shared/data/spec_bench/question.jsonl \
        --set data.train_size=0 --set data.val_size=0 --set data.test_size=480 --out outputs/specbench
    ray job submit --working-dir . -- python -m jobs.generate --preset tiny --out /abs/path
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray

from jobs.generate_vllm import vllm_generate
from jobs.ray_env import init_ray, shutdown
from jobs.resources import wait_for_resources
from peftbd import progress
from peftbd.cli import add_config_args, add_stage_args, config_from_args, run_stage_job, stage_out
from peftbd.config import Config
from peftbd.data.artifact import SPLITS, SplitPlan, plan_splits, write_split
from peftbd.data.continuations import greedy_continuations
from peftbd.data.parts import WORK_SCHEMA, PartStore, actor_peaks, throughput
from peftbd.data.reply_stats import reply_stats
from peftbd.data.sources import (
    Source,
    SourceError,
    load_hub_dataset,
    prepare_records,
    resolve_source,
    source_identity,
)
from peftbd.layout import GENERATE, WORLD
from peftbd.manifest import peak_gpu_mib, peak_rss_mib, read_manifest
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier
from peftbd.process_setup import ready
from peftbd.tiny_world.build import ensure_tiny_world, uses_tiny_world
from peftbd.stage import StageCall, StageInputs

log = logging.getLogger(__name__)

PREPARE_BATCH_ROWS = 512


def read_source(source: Source, cfg: Config, limit: int | None) -> ray.data.Dataset:
    """The raw records of `source` (JSON lines as `{"text": line}`), the first `limit` if given."""
    if source.kind == "hub":
        return ray.data.from_huggingface(load_hub_dataset(source, cfg.data.hub_split, limit))
    if source.kind == "parquet":
        ds = ray.data.read_parquet(source.location)
    else:
        # blank lines stay rows, so they are counted with the other dropped rows
        ds = ray.data.read_text(source.location, file_extensions=["jsonl", "json"],
                                drop_empty_lines=False)
    if limit:
        ds = ds.limit(limit)
        ds.context.execution_options.preserve_order = True  # "first N" must be the file's first N
    return ds


@functools.lru_cache(maxsize=2)
def _tokenizer(cfg: Config) -> Any:
    return load_tokenizer(ready(cfg))  # a Ray task: the world it tokenizes with


def _prepare_batch(batch: pa.Table, cfg: Config, source: Source) -> pa.Table:
    return prepare_records(_tokenizer(cfg), source, batch.to_pylist(), cfg.data.max_prompt_len)


def prepare(source: Source, cfg: Config, limit: int | None) -> ray.data.Dataset:
    """Every record rendered and tokenized by Ray tasks (PREPARED_SCHEMA), materialized."""
    # Ray types the function as taking the batch only; `fn_kwargs` gives the rest
    ds = read_source(source, cfg, limit).map_batches(
        _prepare_batch, fn_kwargs={"cfg": cfg, "source": source}, batch_format="pyarrow",  # type: ignore[arg-type]
        batch_size=PREPARE_BATCH_ROWS,
    )
    try:
        return ds.materialize()
    except Exception as exc:
        raise SourceError(
            f"cannot read data.source={source.name!r} ({source.location}): "
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:500]}"
        ) from exc


def plan_rows(prepared: ray.data.Dataset, cfg: Config, source: Source) -> SplitPlan:
    """The split plan of the prepared rows, stratified by category (only their ids, drop reasons
    and categories reach the driver)."""
    index = pa.concat_tables(ray.get(
        prepared.select_columns(["id", "drop_reason", "category"]).to_arrow_refs()))
    d = cfg.data
    plan = plan_splits(index["id"].to_pylist(), index["drop_reason"].to_pylist(),
                       d.train_size, d.val_size, d.test_size, d.seed, index["category"].to_pylist())
    if not plan.splits:
        raise SourceError(
            f"data.source={source.name!r} yielded no usable prompts ({plan.rows_read} rows read; "
            f"dropped: {plan.dropped or 'none'}; split sizes train/val/test "
            f"{d.train_size}/{d.val_size}/{d.test_size})"
        )
    return plan


def _select(batch: pa.Table, splits: dict[str, str]) -> pa.Table:
    """The rows of `batch` whose ids are in `splits` (id -> split), with a `split` column; a
    typed empty table when none are (a resumed run's blocks are often all done)."""
    where = pc.index_in(batch["id"], value_set=pa.array(list(splits), pa.string()))
    kept = pc.is_valid(where)
    return batch.filter(kept).drop_columns(["drop_reason"]).append_column(
        "split", pa.array(list(splits.values()), pa.string()).take(where.filter(kept))
    )


class VerifierActor:
    """Ray Data callable class: loads the frozen verifier once, then greedily continues batches."""

    def __init__(self, cfg: Config) -> None:
        import torch

        torch.set_num_threads(max(1, int(cfg.generate.num_cpus_per_actor)))
        tokenizer = load_tokenizer(ready(cfg))  # an actor process: the world it loads
        self.model = load_verifier(cfg)
        self.eos_ids = eos_token_ids(self.model, tokenizer)
        self.max_new_tokens = cfg.data.max_new_tokens
        self.name = f"{os.uname().nodename}:{os.getpid()}"
        self.dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        start, cpu_start = time.time(), time.process_time()
        outs = greedy_continuations(self.model, [r["prompt_ids"] for r in rows],
                                    self.max_new_tokens, self.eos_ids)
        bookkeeping = {"actor": self.name, "batch_start": start, "batch_end": time.time(),
                       "batch_cpu_seconds": time.process_time() - cpu_start,
                       "actor_rss_mib": peak_rss_mib(), "actor_gpu_mib": peak_gpu_mib(),
                       "actor_dtype": self.dtype}
        return pa.Table.from_pylist([
            {**row, "continuation_ids": out.ids, "prompt_len": len(row["prompt_ids"]),
             "continuation_len": len(out.ids), "finish_reason": out.finish_reason, **bookkeeping}
            for row, out in zip(rows, outs)
        ], schema=WORK_SCHEMA)


def generate(prepared: ray.data.Dataset, todo: dict[str, str], cfg: Config) -> ray.data.Dataset:
    """The `todo` rows (id -> split) continued by an actor pool of verifiers (`generate.backend:
    engine`) or of vLLM engines (`vllm`: `jobs.generate_vllm`)."""
    g = cfg.generate
    # (Ray types the function as taking the batch only; `fn_kwargs` gives the rest)
    ds = prepared.map_batches(_select, fn_kwargs={"splits": todo}, batch_format="pyarrow",  # type: ignore[arg-type]
                              batch_size=PREPARE_BATCH_ROWS)  # late in a run most hold no todo row
    # One block per batch: actors share the work evenly and each finished batch becomes a part.
    ds = ds.repartition(target_num_rows_per_block=g.batch_size, strict=True)
    ds.context.execution_options.preserve_order = False
    if g.backend == "vllm":
        return vllm_generate(ds, cfg)
    return ds.map_batches(
        VerifierActor, fn_constructor_kwargs={"cfg": cfg}, batch_format="pyarrow",
        batch_size=g.batch_size, compute=ray.data.ActorPoolStrategy(size=g.num_actors),
        num_cpus=g.num_cpus_per_actor, num_gpus=g.num_gpus_per_actor,
    )


def generate_call(cfg: Config, out_dir: str | Path, source: str | None = None,
                  limit: int | None = None, world: str | Path | None = None) -> StageCall:
    """The generate stage writing `out_dir` (`peftbd.layout.GENERATE`).

    `source` overrides `cfg.data.source`; `limit` reads only the first `limit` source rows;
    `world` is the tiny world's artifact when the model or source is embedded (default: the
    cached world, built if missing). What decides the rows: model, data, the world, the source's
    content (each file's sha256, not its location), `limit` (not actors or batch size).
    """
    if source:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source=source))
    upstream = {}
    if uses_tiny_world(cfg):
        upstream[WORLD.name] = (Path(world) if world else
                                ensure_tiny_world(cfg.tiny_world, cfg.paths.cache_dir).root)
    return StageCall(GENERATE, cfg.to_dict(), Path(out_dir), upstream,
                     functools.partial(_build, cfg=cfg, limit=limit),
                     extra={"source": source_identity(cfg), "limit": limit})


def _build(tmp: Path, inputs: StageInputs, cfg: Config, limit: int | None) -> dict[str, Any]:
    """Generate (resuming the parts of an interrupted run with the same fingerprint) and write
    the three splits into `tmp`; returns the manifest sections."""
    out_dir = tmp.with_name(tmp.name.removesuffix(".partial"))
    init_ray()
    g = cfg.generate
    wait_for_resources(f"generate ({g.num_actors} verifier actors)", [
        {"CPU": g.num_cpus_per_actor, "GPU": g.num_gpus_per_actor}] * g.num_actors)
    src = resolve_source(cfg)
    prepared = prepare(src, cfg, limit)
    plan = plan_rows(prepared, cfg, src)

    store = PartStore(out_dir.with_name(out_dir.name + ".work"), inputs.fingerprint)
    done = store.done_ids() & plan.splits.keys()
    todo = {i: s for i, s in plan.splits.items() if i not in done}
    log.info("generate: %d rows planned, %d already done, %d to generate",
             len(plan.splits), len(done), len(todo))
    new_parts: list[Path] = []
    gen_start = time.perf_counter()
    rows = len(done)
    if done:  # an interrupted run's parts (a stopped job, a crash): said where the user looks
        progress.report(rows, len(plan.splits),
                        note=f"resuming: {len(done)} of {len(plan.splits)} rows already done")
    progress.report(rows, len(plan.splits))
    if todo:
        for batch in generate(prepared, todo, cfg).iter_batches(batch_size=None,
                                                                 batch_format="pyarrow"):
            block: pa.Table = batch  # batch_format="pyarrow"
            if block.num_rows:
                new_parts.append(store.write(block))
                rows += block.num_rows
                progress.report(rows, len(plan.splits))
    gen_seconds = time.perf_counter() - gen_start

    table = store.read_complete(plan.splits)
    for split in SPLITS:
        write_split(tmp, split, table.filter(pc.equal(table["split"], split)))
    sections: dict[str, Any] = {
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
        "dropped": plan.dropped,
        "replies": reply_stats(table["continuation_ids"].to_pylist()),
        "throughput": throughput(store.read(new_parts), gen_seconds),
    }
    sections["workers"] = actor_peaks(sections["throughput"].get("per_actor", {})).to_dict()
    store.remove()  # the splits are in `tmp`, which only the manifest and a rename separate from done
    return sections


def run_generate(cfg: Config, out_dir: str | Path, source: str | None = None,
                 limit: int | None = None, force: bool = False) -> Path:
    """Build (or complete, after an interruption) the continuation artifact in `out_dir`, unless
    it is already complete for these inputs. Joins the running Ray (or starts a local one).
    Returns `out_dir`."""
    generate_call(cfg, out_dir, source, limit).run(force)
    return Path(out_dir)


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
    add_stage_args(parser, GENERATE)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    out = stage_out(args, cfg, GENERATE)
    run_stage_job(GENERATE, out, lambda: generate_call(cfg, out, args.source, args.limit),
                  args.force, args.verbose, before_exit=shutdown)
    m = read_manifest(out)
    print(f"generate artifact: {out.resolve()} (rows per split {m['counts']['per_split']}, "
          f"dropped {m['dropped']}, {m['throughput'].get('tokens_per_s', 0)} tokens/s)")


if __name__ == "__main__":
    # Run from the importable module, so Ray pickles `jobs.generate.*` by reference, not `__main__`.
    from jobs.generate import main as _main

    _main()
