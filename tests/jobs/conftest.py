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
