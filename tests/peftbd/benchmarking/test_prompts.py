"""Benchmark prompts weigh the categories alike: any prefix of the held-out prompts is taken
round-robin over their categories (`peftbd.benchmarking.prompts`)."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa

from peftbd.benchmarking.prompts import Prompt, held_out_prompts, interleaved
from peftbd.data.artifact import write_split
from peftbd.manifest import write_manifest


def test_interleaved_takes_the_categories_in_turn_each_in_its_own_order():
    prompts = [Prompt(i, [1], i[0]) for i in ("a0", "a1", "b0", "a2", "c0", "b1", "b2")]
    order = [p.id for p in interleaved(prompts)]
    assert order == ["a0", "b0", "c0", "a1", "b1", "a2", "b2"]
    no_category = [Prompt(str(i), [1]) for i in range(4)]
    assert interleaved(no_category) == no_category


def test_held_out_prompts_are_balanced_at_any_limit(tmp_path):
    cats = ["recall"] * 10 + ["grounded"] * 10 + ["formulaic"] * 10  # the file is sorted by id
    write_split(tmp_path, "test", pa.Table.from_pylist([
        {"id": f"r{i:02d}", "source": "s", "split": "test", "prompt_ids": [1, 2],
         "continuation_ids": [3], "prompt_len": 2, "continuation_len": 1, "finish_reason": "eos",
         "category": c} for i, c in enumerate(cats)]))
    write_manifest(tmp_path, {})
    for limit in (3, 9, 30):
        got = Counter(p.category for p in held_out_prompts(tmp_path, limit).prompts)
        assert got == dict.fromkeys(("recall", "grounded", "formulaic"), limit // 3)
