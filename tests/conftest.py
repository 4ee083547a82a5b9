"""Shared fixtures: the tiny preset and its (cached) embedded world."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from peftbd.config import Config, load_config

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SPEC_BENCH = SHARED / "data" / "spec_bench" / "question.jsonl"

pytest_plugins = [
    "tests.budget_plugin",  # the suite's and quick loop's times vs their budgets
    "tests.schedule_plugin",  # xdist groups, longest first
]

# Local Ray clusters in tests start without the dashboard (2-3 s and a few processes less each).
os.environ.setdefault("PEFTBD_RAY_DASHBOARD", "0")


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """One intra-op torch thread in the test process: tiny forwards gain nothing from two, and
    spin-waiting threads slow everything down on a busy 2-core machine. Restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_cfg() -> Config:
    """The `tiny` preset, this process ready for it (`peftbd.process_setup.ready`: its world built
    once into the cache dir and reused)."""
    from peftbd.process_setup import ready

    return ready(load_config("tiny"))


@pytest.fixture(autouse=True, scope="session")
def tiny_world_built(tiny_cfg: Config) -> None:
    """Every test may load the tiny world's models: its stage runs once per test process, as a
    job's command line runs it (resolvers only locate it)."""


@pytest.fixture(scope="session")
def tiny_world(tiny_cfg: Config):
    """The embedded tiny world, built on first use (a few minutes on 2 cores, then cached)."""
    from peftbd.tiny_world.build import ensure_tiny_world

    return ensure_tiny_world(tiny_cfg.tiny_world, tiny_cfg.paths.cache_dir)


@pytest.fixture(scope="session")
def spec_bench_path() -> Path:
    """Spec-Bench's question.jsonl from ../shared; tests using it skip where it is absent."""
    if not SPEC_BENCH.is_file():
        pytest.skip(f"{SPEC_BENCH} is absent (a user's clone has no ../shared/)")
    return SPEC_BENCH


@pytest.fixture(scope="session")
def make_artifact():
    """`make(out_dir, write, stage="generate", **sections)`: a finished artifact made through the
    stage contract (as a stage job would), its files written by `write(tmp_dir)`."""
    from peftbd.stage import StageSpec, run_stage, stage_inputs

    def make(out_dir: Path, write, stage: str = "generate", **sections) -> Path:
        spec = StageSpec(stage, f"test {stage}", Path(out_dir).name, reads=())

        def build(tmp: Path, _inputs) -> dict:
            write(tmp)
            return dict(sections)

        run_stage(stage_inputs(spec, {}, {}), out_dir, build, {})
        return Path(out_dir)

    return make


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir(tmp_path_factory) -> Path:
    """A directory holding Qwen3's real tokenizer (tests/qwen3_tokenizer.py), built once per
    session (a few seconds)."""
    from .qwen3_tokenizer import qwen3_tokenizer

    path = tmp_path_factory.mktemp("qwen3-tokenizer")
    qwen3_tokenizer().save_pretrained(path)
    return path
