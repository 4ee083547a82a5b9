"""FastMTP's offline rounds against the engine: a head trained on rows whose continuations are the
verifier's greedy output drafts, in `SpeculativeDecoder` with `MTPDrafter`, exactly the rounds that
`peftbd.training.rounds` replays with `mtp_drafts` (steps 2..K included), and the training job's
eval metrics equal the engine's."""

from __future__ import annotations

import pytest
import torch

from peftbd.config import load_config
from peftbd.decoding import MTPDrafter, SpeculativeDecoder
from peftbd.models.loading import eos_token_ids, load_tokenizer
from peftbd.training.examples import collate_sequences
from peftbd.training.mtp_objective import mtp_drafts
from peftbd.training.rounds import replay_rounds
from peftbd.methods import method

from .conftest import ROUNDS_BUDGET as BUDGET
from .conftest import overfit


@pytest.fixture(scope="module")
def trained(tiny_world, greedy_rows):
    """(task, head, rows, eos, pad id): an MTP head trained 20 steps on 16 rows whose continuations are its
    verifier's greedy output (it overfits them, so rounds accept several steps)."""
    cfg = load_config("tiny", overrides=[f"data.max_new_tokens={BUDGET}"])
    task, tok = method("fastmtp").task(cfg), load_tokenizer(cfg)
    head = task.build(torch.device("cpu"))
    eos = eos_token_ids(task.verifier, tok)
    rows = greedy_rows
    overfit(task, head, collate_sequences(rows, tok.pad_token_id), steps=20, lr=1e-2)
    return task, head, rows, eos, tok.pad_token_id


def test_replayed_rounds_are_the_engines_rounds(trained, replay_is_the_engine):
    task, head, rows, eos, pad_id = trained
    k = task.cfg.fastmtp.num_steps
    batch = collate_sequences(rows, pad_id)
    replayed = replay_rounds(mtp_drafts(head, task.verifier, batch, k), batch, budget=BUDGET,
                             block_size=k)
    engine = SpeculativeDecoder(task.verifier, MTPDrafter(head, task.verifier, num_steps=k), eos,
                                BUDGET)
    results = [engine.decode(p) for p in rows["prompt_ids"]]
    replay_is_the_engine(task, head, batch, rows, replayed, results)
    assert any(x.accepted == k for row in replayed for x in row)  # steps 2..K compared too
