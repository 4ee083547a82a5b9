"""Fixtures of the generate tests: a local Ray and one uninterrupted reference run."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from jobs.generate import run_generate
from jobs.ray_env import init_ray
from peftbd.config import Config, load_config

GENERATE_LIMIT = 40
"""The reference run reads the first GENERATE_LIMIT corpus rows and plans 32 of them."""
GENERATE_OVERRIDES = ["data.max_new_tokens=12", "data.train_size=24", "data.val_size=4",
                      "data.test_size=4", "generate.batch_size=4"]


@pytest.fixture(scope="module")
def local_ray(tiny_world):
    init_ray()
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def reference(local_ray, tmp_path_factory) -> tuple[Config, Path]:
    """An uninterrupted run on the first GENERATE_LIMIT corpus rows, two actors (the other runs
    use one: each actor start imports torch and transformers, slow on a busy 2-core machine)."""
    cfg = load_config("tiny", overrides=GENERATE_OVERRIDES)
    return cfg, run_generate(cfg, tmp_path_factory.mktemp("gen") / "ref", limit=GENERATE_LIMIT)
