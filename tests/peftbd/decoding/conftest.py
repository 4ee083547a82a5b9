"""Decoding fixtures: the tiny verifier, its stop ids, a few corpus prompts and test drafters."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from peftbd.data.chat import encode_prompt, prompt_messages
from peftbd.decoding import DecodeState, NoDrafter
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier



@pytest.fixture(scope="session")
def tokenizer(tiny_cfg):
    return load_tokenizer(tiny_cfg)


@pytest.fixture(scope="session")
def verifier(tiny_cfg):
    return load_verifier(tiny_cfg)


@pytest.fixture(scope="session")
def eos(verifier, tokenizer) -> list[int]:
    return eos_token_ids(verifier, tokenizer)


OPEN_QUESTIONS = ("Write a short poem about the sea.", "What is your favourite colour?",
                  "Tell me a joke about cats.")
"""Questions the tiny world never teaches: its verifier reproduces the texts it was taught almost
deterministically, so sampling differs from greedy only where it is unsure, as here."""


@pytest.fixture(scope="session")
def open_prompts(tokenizer) -> list[list[int]]:
    """OPEN_QUESTIONS as chat prompts: where the verifier's next-token distribution is wide."""
    return [encode_prompt(tokenizer, [{"role": "user", "content": q}]) for q in OPEN_QUESTIONS]


@pytest.fixture(scope="session")
def prompts(tiny_world, tokenizer) -> list[tuple[str, list[int]]]:
    """Three short chat prompts from the embedded corpus."""
    with open(tiny_world.corpus_path) as f:
        rows = [json.loads(line) for line in itertools.islice(f, 3)]
    return [(r["id"], encode_prompt(tokenizer, prompt_messages(r["messages"]))) for r in rows]


class ScriptedDrafter(NoDrafter):
    """Proposes `block` tokens of a known continuation; `wrong_from` corrupts the block from that
    index on ((token + 1) mod vocab), so acceptance is exactly predictable."""

    name = "scripted"

    def __init__(self, continuation: list[int], block: int, wrong_from: int | None = None,
                 vocab: int = 2112) -> None:
        self.continuation, self.block, self.wrong_from, self.vocab = continuation, block, wrong_from, vocab

    def propose(self, states: list[DecodeState], max_tokens: list[int]) -> list[torch.Tensor]:
        return [self._one(s, m) for s, m in zip(states, max_tokens)]

    def _one(self, state: DecodeState, max_tokens: int) -> torch.Tensor:
        done = len(state.new_tokens)
        draft = list(self.continuation[done : done + min(self.block, max_tokens)])
        for i in range(len(draft)):
            if self.wrong_from is not None and i >= self.wrong_from:
                draft[i] = (draft[i] + 1) % self.vocab
        return torch.tensor([draft], dtype=torch.long, device=state.device).reshape(1, -1)


@pytest.fixture(scope="session")
def scripted() -> type[ScriptedDrafter]:
    """The `ScriptedDrafter` class (a fixture, so tests need no conftest import)."""
    return ScriptedDrafter
