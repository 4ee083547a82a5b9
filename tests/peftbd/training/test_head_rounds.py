"""The block-diffusion head's training and its offline rounds against the engine: a head trained
on rows whose continuations are the verifier's greedy output drafts, in `SpeculativeDecoder`
with `BDHeadDrafter`, exactly the rounds that `peftbd.training.rounds` replays (so the training
layout of chunks over the context KV is the engine's draft forward, at every offset), the
training job's eval metrics equal the engine's, and the exported head loads back bit-identical."""

from __future__ import annotations

import json

import pytest
import torch

from peftbd.config import load_config
from peftbd.decoding import BDHeadDrafter, SpeculativeDecoder
from peftbd.models.bd_head import BDHead
from peftbd.models.loading import eos_token_ids, load_tokenizer
from peftbd.training.examples import collate_sequences
from peftbd.training.head_objective import head_drafts
from peftbd.training.rounds import replay_rounds
from peftbd.methods import method

from .conftest import ROUNDS_BUDGET as BUDGET
from .conftest import overfit


@pytest.fixture(scope="module")
def trained(tiny_world, greedy_rows):
    """(task, head, rows, eos): a head trained 40 steps on 16 rows whose continuations are its
    verifier's greedy output (it overfits them, so rounds accept long prefixes)."""
    cfg = load_config("tiny", overrides=[f"data.max_new_tokens={BUDGET}", "peftbd_head.block_size=8"])
    task, tok = method("peftbd_head").task(cfg), load_tokenizer(cfg)
    head = task.build(torch.device("cpu"))
    eos = eos_token_ids(task.verifier, tok)
    rows = greedy_rows
    losses = overfit(task, head, collate_sequences(rows, tok.pad_token_id), steps=40, lr=4e-3)
    assert losses[-1] < 0.5 * losses[0], losses[::10]  # it learns
    assert all(p.grad is None for p in task.verifier.parameters())  # the verifier stays frozen
    return task, head, rows, eos


def test_replayed_rounds_are_the_engines_rounds(trained, replay_is_the_engine):
    task, head, rows, eos = trained
    d = task.cfg.peftbd_head.block_size
    batch = collate_sequences(rows, task.pad_id)
    with torch.no_grad():
        replayed = replay_rounds(head_drafts(head, task.verifier, batch, block_size=d,
                                             pad_id=task.pad_id), batch, budget=BUDGET, block_size=d)
    engine = SpeculativeDecoder(task.verifier, BDHeadDrafter(head, task.verifier, d), eos, BUDGET)
    results = [engine.decode(p) for p in rows["prompt_ids"]]
    replay_is_the_engine(task, head, batch, rows, replayed, results)
    for result in results:
        drafting = [r for r in result.rounds if r.proposed]
        assert result.metrics["forward"]["draft"]["calls"] == len(drafting)  # one forward a round


class Recording:
    """A drafter that records every token it proposes."""

    def __init__(self, inner: BDHeadDrafter) -> None:
        self.inner, self.drafted = inner, []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def propose(self, states, max_tokens) -> list[torch.Tensor]:
        out = self.inner.propose(states, max_tokens)
        for draft in out:
            self.drafted.extend(draft[0].tolist())
        return out


def test_draft_vocabulary_drafts_only_its_tokens_and_stays_exact(trained):
    task, head, rows, eos = trained
    d, vocab = task.cfg.peftbd_head.block_size, torch.arange(3, 300)
    full = SpeculativeDecoder(task.verifier, BDHeadDrafter(head, task.verifier, d), eos, BUDGET)
    drafter = Recording(BDHeadDrafter(head, task.verifier, d, vocab_ids=vocab))
    small = SpeculativeDecoder(task.verifier, drafter, eos, BUDGET)
    for prompt in rows["prompt_ids"][:4]:
        assert small.decode(prompt).tokens == full.decode(prompt).tokens
    assert drafter.drafted and set(drafter.drafted) <= set(vocab.tolist())


def test_exported_head_loads_bit_identical(trained, tmp_path):
    task, head, rows, eos = trained
    path = task.export(head, tmp_path)
    loaded = BDHead.from_pretrained(tmp_path, task.verifier)  # the run's dir: finds bd_head/
    assert path == tmp_path / "bd_head"
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    own = {n for n, _ in head.named_parameters()}
    assert not any(n.startswith(("embed", "lm_head")) for n in own)  # shared, not copied
    assert {n.split(".")[0] for n in own} == {"project", "context_norm", "anchor_norm", "fuse",
                                                 "layers", "norm", "mask_embedding"}


def test_loading_onto_another_verifier_shape_fails_clearly(trained, tmp_path):
    task, head, *_ = trained
    head.save_pretrained(tmp_path)
    meta = json.loads((tmp_path / "bd_head.json").read_text())
    meta["verifier"]["hidden_size"] += 1
    (tmp_path / "bd_head.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="was trained for verifier shape"):
        BDHead.from_pretrained(tmp_path, task.verifier)
    with pytest.raises(FileNotFoundError, match="jobs.train --method peftbd_head"):
        BDHead.from_pretrained(tmp_path / "nowhere", task.verifier)
