"""The benchmark on the fast path: its warm-ups run every timed pass once, so every graph the
timed passes use compiles untimed; the compile time is kept per arm and any compile inside a
timed pass would be counted. Compiled AR decodes eager AR's tokens."""

from __future__ import annotations

import pytest

from peftbd.benchmarking.arms import DrafterDirs, arm_specs, load_arm_models
from peftbd.benchmarking.prompts import Prompt
from peftbd.benchmarking.runner import time_arms
from peftbd.decoding import SpeculativeDecoder

pytestmark = pytest.mark.slow  # compiles AR's and prompt lookup's verify graphs (~20 s on 2 cores)


TEXTS = ("The sea is calm today and the sea is", "def add(a, b):\n    return a + b\n\ndef",
         "One, two, three, one, two,", "Write a short poem about")


def test_no_graph_compiles_inside_a_timed_pass(tiny_cfg):
    from peftbd.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny_cfg)
    models = load_arm_models(tiny_cfg, DrafterDirs({}))  # AR and the model-free prompt lookup
    specs = [s for s in arm_specs(tiny_cfg) if s.id in ("ar", "prompt_lookup")]
    prompts = [Prompt(f"p{i}", tokenizer(t).input_ids) for i, t in enumerate(TEXTS)]
    timings = time_arms(models, specs, prompts, 1, 24, (1, 2), fast_path=True)
    assert timings.paths == {"ar": {"verify": "compiled"}, "prompt_lookup": {"verify": "compiled"}}
    assert {arm: c.timed for arm, c in timings.compiles.items()} == {"ar": 0, "prompt_lookup": 0}
    assert sum(c.seconds for c in timings.compiles.values()) > 0
    ar = [r.tokens for r in timings.results["ar"][0]]
    eager = SpeculativeDecoder(models.verifier, None, models.eos_ids, 24)
    assert ar == [eager.decode(p.prompt_ids).tokens for p in prompts]  # compiled AR: eager's tokens
    assert [r.tokens for r in timings.results["prompt_lookup"][0]] == ar
