"""Benchmark prompts: the continuation artifact's held-out test split, or Spec-Bench questions.

Both give `Prompt`s of token ids already rendered with the chat template (thinking off), so the
benchmark times decoding only.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from peftbd.config import Config
from peftbd.data.artifact import read_split
from peftbd.data.sources import SPEC_BENCH_PREFIX, prepare_record, spec_bench_source
from peftbd.errors import UserError
from peftbd.models.loading import load_tokenizer


class PromptError(UserError, ValueError):
    """Benchmark prompts that cannot be loaded; the message says how to fix it."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: its id, token ids and (Spec-Bench) category."""

    id: str
    prompt_ids: list[int]
    category: str | None = None


@dataclass(frozen=True)
class PromptSet:
    """The prompts of a benchmark run, where they came from and what was dropped (by reason)."""

    prompts: list[Prompt]
    source: str  # test | spec-bench
    path: str
    dropped: dict[str, int] = field(default_factory=dict)

    def categories(self) -> dict[str, int] | None:
        """Prompt count per category, or None when the prompts have no categories."""
        cats = Counter(p.category for p in self.prompts if p.category is not None)
        return dict(sorted(cats.items())) or None


def interleaved(prompts: Sequence[Prompt]) -> list[Prompt]:
    """`prompts` taken round-robin over their categories (each category in its own order, the
    categories in order of first appearance), so every prefix weighs the categories alike."""
    by_category: dict[str | None, list[Prompt]] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    return [p for group in itertools.zip_longest(*by_category.values()) for p in group if p]


def held_out_prompts(artifact_dir: str | Path, limit: int) -> PromptSet:
    """The first `limit` prompts of the artifact's held-out test split, its rows (by id) taken
    round-robin over their categories (`interleaved`)."""
    if limit < 1:
        raise PromptError(f"decoding.num_prompts={limit}: need at least 1 prompt")
    rows = read_split(artifact_dir, "test").select(["id", "prompt_ids", "category"]).to_pylist()
    if not rows:
        raise PromptError(
            f"the test split of {str(artifact_dir)!r} is empty; regenerate the artifact with "
            "data.test_size >= 1"
        )
    prompts = [Prompt(r["id"], r["prompt_ids"], r["category"]) for r in rows]
    return PromptSet(interleaved(prompts)[:limit], "test", str(artifact_dir))


def spec_bench_prompts(tokenizer: PreTrainedTokenizerBase, path: str | Path, max_prompt_len: int,
                       limit: int) -> PromptSet:
    """Up to `limit` Spec-Bench questions (first turn as the user message, chat template applied),
    taken round-robin over categories in file order so every category is represented; questions
    longer than `max_prompt_len` (`data.max_prompt_len`) tokens are dropped and counted."""
    source = spec_bench_source(path)
    prompts: list[Prompt] = []
    dropped: Counter[str] = Counter()
    with open(source.location, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = prepare_record(tokenizer, source, {"text": line}, max_prompt_len)
            if row["drop_reason"]:
                dropped[row["drop_reason"]] += 1
                continue
            prompts.append(Prompt(row["id"], row["prompt_ids"], row["category"] or "uncategorized"))
    if not prompts:
        raise PromptError(
            f"no usable Spec-Bench question in {source.location!r} (dropped: {dict(dropped)}); "
            f"raise data.max_prompt_len (now {max_prompt_len}) if they are too long"
        )
    return PromptSet(interleaved(prompts)[:limit], "spec-bench", source.location, dict(dropped))


def load_prompts(cfg: Config, continuations_dir: str | Path | None, prompts: str) -> PromptSet:
    """`prompts` = "test" (the held-out split of the artifact in `continuations_dir`) or
    "spec-bench:PATH" (Spec-Bench's question.jsonl, no artifact needed: `continuations_dir` may
    be None); at most `decoding.num_prompts` of them."""
    limit = cfg.decoding.num_prompts
    if prompts == "test":
        if continuations_dir is None:
            raise PromptError("prompts='test' reads the held-out split of the generate stage's "
                              "artifact, and none was given")
        return held_out_prompts(continuations_dir, limit)
    if prompts.startswith(SPEC_BENCH_PREFIX):
        return spec_bench_prompts(load_tokenizer(cfg), prompts[len(SPEC_BENCH_PREFIX):],
                                  cfg.data.max_prompt_len, limit)
    raise PromptError(
        f"prompts={prompts!r}: use 'test' (the artifact's held-out split) or "
        f"'spec-bench:PATH' (Spec-Bench's question.jsonl)"
    )
