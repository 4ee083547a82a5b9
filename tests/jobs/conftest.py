"""Fixtures of the jobs' tests: a local Ray and one uninterrupted generate run (the generate tests);
a pipeline output root with untrained drafters (the benchmark's, run in-process or submitted)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
import ray
import torch

from jobs.generate import run_generate
from jobs.ray_env import init_ray
from peftbd.config import Config, load_config
from peftbd.data.artifact import write_split
from peftbd.data.chat import encode_prompt, prompt_messages
from peftbd.methods import methods
from peftbd.models.loading import load_tokenizer

GENERATE_LIMIT = 40
"""The reference run reads the first GENERATE_LIMIT corpus rows and plans 32 of them."""
GENERATE_OVERRIDES = ["data.max_new_tokens=12", "data.train_size=24", "data.val_size=4",
                      "data.test_size=4", "generate.batch_size=4"]
N_PROMPTS = 3
BENCHMARK_SETS = (f"decoding.num_prompts={N_PROMPTS}", "decoding.max_new_tokens=12",
                  "decoding.repeats=2", "decoding.torch_threads=1", "decoding.batch_sizes=[1,2]",
                  "decoding.sweep_variants=true")
"""The benchmark tests' settings over tiny-full (every arm, the ablations too): a few short
prompts, every arm in the concurrency sweep at batch 1 and 2 (a batch below N_PROMPTS: requests
join as others end)."""


@pytest.fixture(scope="module")
def local_ray(tiny_world):
    init_ray()
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def reference_dir(tmp_path_factory) -> Path:
    """Where this test process keeps the reference run: test_generate.py and
    test_generate_resume.py share it (one xdist group, tests/schedule_plugin.py)."""
    return tmp_path_factory.mktemp("gen") / "ref"


@pytest.fixture(scope="module")
def reference(local_ray, reference_dir) -> tuple[Config, Path]:
    """An uninterrupted run on the first GENERATE_LIMIT corpus rows, two actors (the other runs
    use one: each actor start imports torch and transformers, slow on a busy 2-core machine).
    Built once per test process: the stage contract skips a finished run of the same inputs."""
    cfg = load_config("tiny", overrides=GENERATE_OVERRIDES)
    return cfg, run_generate(cfg, reference_dir, limit=GENERATE_LIMIT)


@pytest.fixture(scope="module")
def small_cfg() -> Config:
    """tiny-full with BENCHMARK_SETS."""
    return load_config("tiny-full", overrides=list(BENCHMARK_SETS))


@pytest.fixture(scope="module")
def artifacts(small_cfg: Config, tiny_world, tmp_path_factory, make_artifact) -> Path:
    """A pipeline output root: a test split of corpus prompts and untrained drafters exported by
    the training tasks (as the training jobs export them)."""
    root = tmp_path_factory.mktemp("artifacts")
    tok = load_tokenizer(small_cfg)
    rows = []
    with open(tiny_world.corpus_path) as f:
        for line in f:
            rec = json.loads(line)
            ids = encode_prompt(tok, prompt_messages(rec["messages"]))
            rows.append({"id": rec["id"], "source": "test", "split": "test", "prompt_ids": ids,
                         "continuation_ids": [], "prompt_len": len(ids), "continuation_len": 0,
                         "finish_reason": "length", "category": None})
            if len(rows) == N_PROMPTS + 2:
                break
    train = [{**r, "id": f"train-{r['id']}", "split": "train", "continuation_ids": r["prompt_ids"],
              "continuation_len": r["prompt_len"]} for r in rows]  # counted for the draft vocabulary
    make_artifact(root / "continuations",
                  lambda tmp: (write_split(tmp, "test", pa.Table.from_pylist(rows)),
                               write_split(tmp, "train", pa.Table.from_pylist(train))),
                  wall_seconds=11.5, peak_rss_mib=512.0, peak_gpu_mib=None)
    torch.manual_seed(0)
    for method in methods():  # every registered method's training stages, as the main job runs them
        for spec, cfg in method.training_stages(small_cfg):
            task = method.task(cfg)
            module = task.build(torch.device("cpu"))
            make_artifact(root / spec.subdir, lambda tmp, t=task, m=module: t.export(m, tmp),
                          stage=spec.name, untrained=True, wall_seconds=0.5, peak_rss_mib=400.0)
    return root
