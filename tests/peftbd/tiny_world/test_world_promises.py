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
from peftbd.models.loading import load_tokenizer, load_verifier
from peftbd.tiny_world.corpus import CATEGORIES, FORMULAIC, GROUNDED

ROWS = 6
"""Rows decoded per checked category (greedy, the verifier alone: ~1 s a row)."""


@pytest.fixture(scope="module")
def replies(tiny_cfg, tiny_world) -> dict[str, list[tuple[str, str, int]]]:
    """{category: [(the taught answer, the verifier's greedy reply, its tokens)]}, ROWS each."""
    tokenizer, model = load_tokenizer(tiny_cfg), load_verifier(tiny_cfg, torch.device("cpu"))
    rows = [json.loads(line) for line in tiny_world.corpus_path.read_text().splitlines()]
    out: dict[str, list[tuple[str, str, int]]] = {}
    for cat in (FORMULAIC, GROUNDED):
        for row in [r for r in rows if r["category"] == cat][:ROWS]:
            ids = torch.tensor([encode_prompt(tokenizer, row["messages"][:-1])])
            with torch.no_grad():
                gen = model.generate(ids, max_new_tokens=256, do_sample=False)[0, ids.shape[1]:]
            text = tokenizer.decode(gen, skip_special_tokens=True)
            out.setdefault(cat, []).append((row["messages"][-1]["content"], text.strip(), len(gen)))
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

