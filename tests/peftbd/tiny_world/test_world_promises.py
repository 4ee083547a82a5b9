"""What the tiny world promises a drafter study: every category present in its prompts, and the
verifier's greedy replies correct where a reply is computed or copied (formulaic and grounded
rows), so a drafter predicts the verifier's text, not its confusion (that they are long is
`test_build.test_tiny_verifier_replies_are_in_the_papers_regime`'s)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from peftbd.data.chat import encode_prompt
from peftbd.decoding import SpeculativeDecoder
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier
from peftbd.tiny_world.corpus import CATEGORIES, FORMULAIC, GROUNDED

ROWS = 6
"""Rows decoded per checked category (greedy, the verifier alone)."""


@pytest.fixture(scope="module")
def replies(tiny_cfg, tiny_world) -> dict[str, list[tuple[str, str, int]]]:
    """{category: [(the taught answer, the verifier's greedy reply, its tokens)]}, ROWS each."""
    tokenizer, model = load_tokenizer(tiny_cfg), load_verifier(tiny_cfg, torch.device("cpu"))
    rows = [json.loads(line) for line in tiny_world.corpus_path.read_text().splitlines()]
    picked = [r for cat in (FORMULAIC, GROUNDED) for r in [r for r in rows if r["category"] == cat][:ROWS]]
    # the engine's greedy AR (HF generate's tokens: tests/peftbd/benchmarking/test_references.py),
    # all rows in one batch
    engine = SpeculativeDecoder(model, None, eos_token_ids(model, tokenizer), 256)
    results = engine.decode_many([encode_prompt(tokenizer, r["messages"][:-1]) for r in picked], len(picked))
    out: dict[str, list[tuple[str, str, int]]] = {}
    for row, result in zip(picked, results):
        text = tokenizer.decode(result.tokens, skip_special_tokens=True)
        out.setdefault(row["category"], []).append((row["messages"][-1]["content"], text.strip(),
                                                    len(result.tokens)))
    return out


def test_every_category_holds_about_a_third_of_the_prompts(tiny_world):
    rows = [json.loads(line) for line in tiny_world.corpus_path.read_text().splitlines()]
    counts = Counter(r["category"] for r in rows)
    assert set(counts) == set(CATEGORIES)
    assert all(abs(n / len(rows) - 1 / 3) < 0.01 for n in counts.values())


def test_formulaic_and_grounded_replies_are_correct(replies):
    for cat in (FORMULAIC, GROUNDED):
        correct = sum(reply == answer for answer, reply, _ in replies[cat])
        assert correct >= ROWS - 1, (cat, [(a[:60], r[:60]) for a, r, _ in replies[cat]])

