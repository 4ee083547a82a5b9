"""Bring your own drafter (docs/adding-a-drafter.md), followed to the letter: the method of
`tests/plugins/toy_bigram_drafter.py` (a module outside the project's packages: a low-rank bigram
drafter, its section, task and `Method`) reaches the project only through `methods.plugins` in
the config, and is trained a few steps (the Ray-free schedule the training job runs),
benchmarked with the exact greedy audit, costed by the cost profile and served by the replicas'
model loader: no other file knows it. `tests/jobs/test_pipeline_e2e.py` runs it through the main
job, `tests/serve_apps/test_serve_plugin.py` through a Serve app."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from peftbd.benchmarking import cost_profile as cp
from peftbd.benchmarking.arms import DrafterDirs
from peftbd.benchmarking.prompts import Prompt
from peftbd.benchmarking.runner import run_shard
from peftbd.config import Config, load_config
from peftbd.decoding import SpeculativeDecoder
from peftbd.methods import AR_ARM, method, methods, unregister
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier
from peftbd.serving.models import load_serving_models
from peftbd.training.checkpoint import TrainState
from peftbd.training.deepspeed_config import batch_plan
from peftbd.training.examples import collate_sequences
from peftbd.training.schedule import Schedule, WorkerData, train

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
PLUGIN = "toy_bigram_drafter"
STEPS = 12


@pytest.fixture
def plugin(monkeypatch):
    """`methods.plugins: [toy_bigram_drafter]` importable (its directory on sys.path); its
    registration undone afterwards (the registry is this process's)."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    yield [f"methods.plugins=[{PLUGIN}]"]
    unregister("toy_bigram")
    sys.modules.pop(PLUGIN, None)


def test_an_unknown_section_names_the_plugin_key_and_an_unimportable_plugin_is_one_line():
    with pytest.raises(ValueError, match="unknown config key 'toy_bigram'.*methods.plugins"):
        load_config("tiny", overrides=["toy_bigram.rank=4"])
    with pytest.raises(ValueError, match="methods.plugins': cannot import 'no_such_plugin'.*PYTHONPATH"):
        load_config("tiny", overrides=["methods.plugins=[no_such_plugin]"])


def _greedy_rows(cfg: Config, n: int) -> tuple[list[dict], list[Prompt]]:
    """`n` one-row micro-batches of the tiny verifier's own greedy continuations of random
    prompts (what the drafter learns to predict), and the prompts."""
    tok, verifier = load_tokenizer(cfg), load_verifier(cfg, torch.device("cpu"))
    ar = SpeculativeDecoder(verifier, None, eos_token_ids(verifier, tok), 24)
    gen = torch.Generator().manual_seed(3)
    prompts = [Prompt(f"p{i}", torch.randint(10, len(tok) - 10, (12,), generator=gen).tolist())
               for i in range(n)]
    rows = [{"id": [p.id], "prompt_ids": [p.prompt_ids], "continuation_ids": [ar.decode(p.prompt_ids).tokens],
             "prompt_len": [len(p.prompt_ids)]} for p in prompts]
    return rows, prompts


@pytest.mark.slow  # ~30 s: a training, a benchmark shard, a cost profile and a Serve replica
def test_a_plugin_drafter_trains_benchmarks_costs_and_serves(plugin, ds_engine, tiny_world, tmp_path):
    cfg = load_config("tiny", overrides=[*plugin, "training.micro_batch_size=1", "toy_bigram.rank=16",
                                         "decoding.max_new_tokens=24"])
    toy = method("toy_bigram")
    assert toy in methods() and cfg.toy_bigram.draft_tokens == 3  # its section, its defaults
    assert toy.stage is not None and toy.stage.name == "train_toy_bigram" and toy.dir_arg == "toy_bigram_dir"
    # trained: the training job's schedule, without Ray
    task = toy.task(cfg)
    engine = ds_engine(task.build(torch.device("cpu")), cfg, task.optim)
    rows, prompts = _greedy_rows(cfg, 8)
    pad_id = load_tokenizer(cfg).pad_token_id
    schedule = Schedule.of(task.optim, batch_plan(cfg.training, task.optim, 1), STEPS, len(rows))
    losses: dict[int, float] = {}
    data = WorkerData(lambda: iter(rows), lambda r: collate_sequences(r, pad_id),
                      [collate_sequences(rows[0], pad_id)])
    trained = train(engine, task, schedule, TrainState(), data, lambda *a, **k: None,
                    lambda done, total, loss: losses.__setitem__(done, loss))
    assert trained.state.step == STEPS and losses[STEPS] < losses[1]
    out = tmp_path / toy.stage.subdir
    task.export(engine.module, out)

    # benchmarked, with the exact greedy audit and acceptance of its own
    specs = [AR_ARM, *toy.arms(cfg)]
    shard = run_shard(cfg, DrafterDirs({toy.stage.name: str(out)}), specs, prompts[:4], repeats=1)
    assert set(shard.results) == {"ar", "toy_bigram"}
    assert shard.mismatches["toy_bigram"] == []
    toy_runs, ar_runs = shard.results["toy_bigram"][0], shard.results["ar"][0]
    assert [r.tokens for r in toy_runs] == [r.tokens for r in ar_runs]
    assert sum(r.accepted for run in toy_runs for r in run.rounds) > 0  # it learnt some bigrams

    # costed: the cost profile times every registered method, this one included
    profile = cp.run_profile(load_config("tiny", overrides=[*plugin,
        "cost_profile.architecture=model", "cost_profile.early_exit_layers=1", "cost_profile.repeats=1", "cost_profile.kv_len=16",
        "cost_profile.dtypes=[float32]", "cost_profile.decode_tokens=0"])).to_dict()
    toy_cost = json.loads(json.dumps(profile))["profiles"]["float32"]["arms"]["toy_bigram"]
    assert toy_cost["method"] == "toy_bigram" and toy_cost["draft_calls"] == 3
    assert toy_cost["draft_ms_round"] > 0

    # served: what both Serve apps' replicas load, by its serving name, exact
    served = load_serving_models(cfg, ["ar", toy.serving], {toy.serving: str(out)})
    prompt = prompts[0].prompt_ids
    assert served.decoder(toy.serving).decode(prompt, 16).tokens == served.decoder("ar").decode(prompt, 16).tokens
