"""The offline estimate of the engine's rounds (`peftbd.training.rounds`) against the engine itself:
on rows whose continuations are the verifier's greedy output, the replayed rounds are the
engine's (SpeculativeDecoder + PeftBDDrafter), round for round, for both adapter depths."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
import torch

from peftbd.config import load_config
from peftbd.data.chat import encode_prompt, prompt_messages
from peftbd.decoding import PeftBDDrafter, SpeculativeDecoder, summarize
from peftbd.models.loading import eos_token_ids, load_tokenizer
from peftbd.training.evaluate import evaluate
from peftbd.training.examples import collate_sequences
from peftbd.training.rounds import peftbd_drafts, replay_rounds
from peftbd.training.tasks import PeftBDTask

BUDGET = 20  # short: some rows end on EOS, some on the budget


@pytest.fixture(scope="module")
def cfg(tiny_world):
    return load_config("tiny", overrides=[f"data.max_new_tokens={BUDGET}"])


@pytest.fixture(scope="module", params=[0, 1], ids=["whole-backbone", "early-exit-1"])
def trained(request, cfg, tiny_world):
    """(task, adapter, rows, eos): an adapter trained 50 steps on 16 rows whose continuations are
    its verifier's greedy output (it overfits them, so rounds accept long prefixes)."""
    cfg = dataclasses.replace(cfg, drafter=dataclasses.replace(cfg.drafter, draft_layers=request.param))
    task, tok = PeftBDTask(cfg), load_tokenizer(cfg)
    model = task.build(torch.device("cpu"))
    with open(tiny_world.corpus_path) as f:
        records = [json.loads(line) for line in itertools.islice(f, 120)]
    prompts = [p for p in (encode_prompt(tok, prompt_messages(r["messages"])) for r in records)
               if len(p) <= 128][:16]
    eos = eos_token_ids(model.get_base_model(), tok)
    greedy = SpeculativeDecoder(model, None, eos, BUDGET)  # the adapter is off: the verifier
    rows = {"id": [str(i) for i in range(len(prompts))], "prompt_ids": prompts,
            "continuation_ids": [greedy.decode(p).tokens for p in prompts],
            "prompt_len": [len(p) for p in prompts]}
    batch = collate_sequences(rows, tok.pad_token_id)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=6e-3)
    for step in range(50):
        optimizer.zero_grad()
        task.train_loss(model, batch, epoch=step).backward()
        optimizer.step()
    model.eval()
    return task, model, rows, eos


def test_replayed_rounds_are_the_engines_rounds(trained):
    task, model, rows, eos = trained
    batch = collate_sequences(rows, task.pad_id)
    drafts = peftbd_drafts(model, batch, block_size=task.cfg.drafter.block_size,
                           mask_id=task.mask_id, pad_id=task.pad_id, anchored=False)
    replayed = replay_rounds(drafts, batch, budget=BUDGET, block_size=task.cfg.drafter.block_size)
    engine = SpeculativeDecoder(model, PeftBDDrafter(model, task.mask_id, task.cfg.drafter.block_size),
                                eos, BUDGET)
    results = [engine.decode(p) for p in rows["prompt_ids"]]
    for result, continuation, rounds in zip(results, rows["continuation_ids"], replayed, strict=True):
        assert result.tokens == continuation  # exact greedy: the continuation is what it commits
        assert [(x.proposed, x.accepted) for x in result.rounds] == [
            (x.proposed, x.accepted) for x in rounds]
    ends = {len(c) == BUDGET for c in rows["continuation_ids"]}
    assert ends == {True, False}  # rows that ended on the budget and rows that ended on EOS
    long_prefixes = sum(x.accepted >= 2 for row in replayed for x in row)
    assert long_prefixes >= 4, long_prefixes  # the adapter drafts: multi-token prefixes compared
    measured = summarize(results)
    offline = evaluate(task, model, [batch])  # the training job's eval metrics of the same rows
    assert offline["eval_rounds"] == measured["rounds"]
    assert offline["eval_accepted_prefix_mean"] == pytest.approx(measured["mean_accepted_prefix"])
    assert offline["eval_target_token_accuracy"] == pytest.approx(measured["token_acceptance"])
