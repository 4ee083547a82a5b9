"""The offline estimate of the engine's rounds (`peftbd.training.rounds`) against the engine itself:
on rows whose continuations are the verifier's greedy output, the replayed rounds are the
engine's (SpeculativeDecoder + PeftBDDrafter), round for round, for both adapter depths."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from peftbd.config import load_config
from peftbd.decoding import PeftBDDrafter, SpeculativeDecoder
from peftbd.models.loading import eos_token_ids, load_tokenizer
from peftbd.training.examples import collate_sequences
from peftbd.training.rounds import peftbd_drafts, replay_rounds
from peftbd.training.tasks import PeftBDTask

from .conftest import ROUNDS_BUDGET as BUDGET
from .conftest import overfit


@pytest.fixture(scope="module")
def cfg(tiny_world):
    return load_config("tiny", overrides=[f"data.max_new_tokens={BUDGET}"])


@pytest.fixture(scope="module", params=[0, 1], ids=["whole-backbone", "early-exit-1"])
def trained(request, cfg, tiny_world, greedy_rows):
    """(task, adapter, rows, eos): an adapter trained 50 steps on 16 rows whose continuations are
    its verifier's greedy output (it overfits them, so rounds accept long prefixes)."""
    cfg = cfg.with_section("peftbd", dataclasses.replace(cfg.peftbd, draft_layers=request.param))
    task, tok = PeftBDTask(cfg), load_tokenizer(cfg)
    model = task.build(torch.device("cpu"))
    eos = eos_token_ids(model.get_base_model(), tok)
    rows = greedy_rows  # the verifier's greedy output: the adapter-off model must commit it
    overfit(task, model, collate_sequences(rows, tok.pad_token_id), steps=50, lr=6e-3)
    return task, model, rows, eos


def test_replayed_rounds_are_the_engines_rounds(trained, replay_is_the_engine):
    task, model, rows, eos = trained
    batch = collate_sequences(rows, task.pad_id)
    drafts = peftbd_drafts(model, batch, block_size=task.cfg.peftbd.block_size,
                           mask_id=task.mask_id, pad_id=task.pad_id, anchored=False)
    replayed = replay_rounds(drafts, batch, budget=BUDGET, block_size=task.cfg.peftbd.block_size)
    engine = SpeculativeDecoder(model, PeftBDDrafter(model, task.mask_id, task.cfg.peftbd.block_size),
                                eos, BUDGET)
    results = [engine.decode(p) for p in rows["prompt_ids"]]
    ends = {len(c) == BUDGET for c in rows["continuation_ids"]}
    assert ends == {True, False}  # rows that ended on the budget and rows that ended on EOS
    replay_is_the_engine(task, model, batch, rows, replayed, results)
