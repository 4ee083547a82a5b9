"""Generate's vLLM backend (`generate.backend: vllm`): the same rows continued by vLLM through Ray
Data's LLM API (`ray.data.llm`: `vLLMEngineProcessorConfig` + `build_processor`), one vLLM engine
per actor, in place of `jobs.generate.VerifierActor`; everything around it (prompts, splits, parts,
resume, the artifact) is generate's own.

Same rows as the engine: vLLM gets each row's `prompt_ids` as they are (`tokenized_prompt`: our
chat template and its thinking switch, no template or tokenizer of vLLM's), decodes greedily up to
`data.max_new_tokens` and stops at the same EOS ids, kept in the reply as the engine keeps them.

Where vLLM runs: in its own environment (`scripts/install.sh --with-vllm`: vLLM and this Ray
version), which the engine actors start in (runtime_env `py_executable`); the driver and the
other stages stay in this project's. Resources: each engine actor asks for one bundle of
`generate.num_cpus_per_actor` CPUs and `num_gpus_per_actor` GPUs (a CPU-only bundle on a machine
without GPUs: vLLM's CPU build, no logical GPU faked); `num_actors` engines (`concurrency`).

Bookkeeping: vLLM's engine runs in processes of its own, so an actor's CPU time and memory peak
are not measured (null); a batch's span is its slowest request's time in vLLM up to its arrival.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from pathlib import Path

import pyarrow as pa
import ray
from huggingface_hub import snapshot_download
from transformers import AutoTokenizer, GenerationConfig

from jobs.vllm_node import vllm_where
from peftbd.config import RANDOM_WEIGHTS, Config, ConfigError
from peftbd.data.parts import WORK_SCHEMA
from peftbd.models.loading import stop_ids
from peftbd.models.sources import model_dirs
from peftbd.peers.vllm_env import cpu_memory_share

ACTOR = "vllm"
"""The `actor` of every vLLM row: its engines are not told apart."""
KEPT = ("id", "source", "split", "category")
"""A prepared row's columns that its reply keeps as they are."""


def _request(row: dict[str, Any], max_new_tokens: int, stop: list[int]) -> dict[str, Any]:
    """A prepared row as the vLLM stage's request: its token ids, greedy sampling."""
    return {**row, "tokenized_prompt": list(row["prompt_ids"]),
            "sampling_params": {"temperature": 0.0, "max_tokens": max_new_tokens,
                                "stop_token_ids": stop, "detokenize": False}}


def _reply(row: dict[str, Any], stop: list[int], dtype: str) -> dict[str, Any]:
    """The vLLM stage's output row as a WORK_SCHEMA row (batch bookkeeping: `_batch_span`)."""
    ids = [int(t) for t in row["generated_tokens"]]
    return {**{k: row[k] for k in KEPT}, "prompt_ids": [int(t) for t in row["prompt_ids"]],
            "continuation_ids": ids, "prompt_len": len(row["prompt_ids"]), "continuation_len": len(ids),
            "finish_reason": "eos" if ids and ids[-1] in stop else "length",
            "time_taken_llm": float(row["time_taken_llm"]), "actor": ACTOR, "actor_dtype": dtype}


def _batch_span(batch: pa.Table) -> pa.Table:
    """A block of replies with its span: from its slowest request's start in vLLM to now."""
    end = time.time()
    start = end - max(batch["time_taken_llm"].to_pylist(), default=0.0)
    n = batch.num_rows
    filled = {"batch_start": [start] * n, "batch_end": [end] * n, "batch_cpu_seconds": [None] * n,
              "actor_rss_mib": [None] * n, "actor_gpu_mib": [None] * n}
    columns = {name: batch[name] if name in batch.column_names else pa.array(filled[name], field.type)
               for name, field in zip(WORK_SCHEMA.names, WORK_SCHEMA)}
    return pa.table(columns, schema=WORK_SCHEMA)


def vllm_generate(ds: ray.data.Dataset, cfg: Config) -> ray.data.Dataset:
    """The rows of `ds` (prepared rows with their `split`) continued by vLLM engine actors, as
    WORK_SCHEMA rows, one block per batch."""
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    g, d = cfg.generate, cfg.data
    tokenizer_dir, model_dir = model_dirs(cfg)
    if model_dir.startswith(RANDOM_WEIGHTS):
        raise ConfigError(f"generate.backend=vllm loads a checkpoint, but model.name_or_path="
                          f"{model_dir!r} is built in memory; use generate.backend=engine")
    stop = stop_ids(GenerationConfig.from_pretrained(model_dir),
                    AutoTokenizer.from_pretrained(tokenizer_dir))
    bundle = {k: v for k, v in (("CPU", g.num_cpus_per_actor), ("GPU", g.num_gpus_per_actor)) if v}
    if not bundle:
        raise ConfigError("generate.backend=vllm: generate.num_cpus_per_actor and num_gpus_per_actor "
                          "are both 0; give each vLLM engine actor the CPUs (and GPUs) it runs on")
    engine: dict[str, Any] = {"dtype": cfg.model.dtype, "max_model_len": d.max_prompt_len + d.max_new_tokens,
                              "max_num_seqs": g.batch_size, "skip_tokenizer_init": True, "seed": d.seed}
    if not g.num_gpus_per_actor:  # vLLM's CPU build: its RAM share, and no compile to wait for
        engine |= {"gpu_memory_utilization": cpu_memory_share(_weight_bytes(model_dir)),
                   "enforce_eager": True}
    config = vLLMEngineProcessorConfig(
        model_source=model_dir, engine_kwargs=engine, batch_size=g.batch_size, concurrency=g.num_actors,
        placement_group_config={"bundles": [bundle]},
        runtime_env=engine_runtime_env(bundle, max(1, int(g.num_cpus_per_actor))),
        chat_template_stage=False, tokenize_stage=False, detokenize_stage=False, log_engine_metrics=False)
    processor = build_processor(
        config, preprocess=functools.partial(_request, max_new_tokens=d.max_new_tokens, stop=stop),
        postprocess=functools.partial(_reply, stop=stop, dtype=cfg.model.dtype))
    return processor(ds).map_batches(_batch_span, batch_format="pyarrow", batch_size=None)


def engine_runtime_env(bundle: dict[str, float], threads: int) -> dict[str, Any]:
    """The engine actors' runtime env (`py_executable`, env vars), resolved where they run (by a
    task with an engine's resources: `jobs.vllm_node`), not where the driver does."""
    found = vllm_where(bundle, threads, "generate.backend=vllm")
    return {"py_executable": found.python, "env_vars": found.env}


def _weight_bytes(model_dir: str) -> int:
    """The size of the checkpoint's weight files (a local directory, or a hub id's cached copy)."""
    local = Path(model_dir)
    if not local.is_dir():
        local = Path(snapshot_download(model_dir, local_files_only=True))
    return sum(f.stat().st_size for f in local.glob("*.safetensors"))
