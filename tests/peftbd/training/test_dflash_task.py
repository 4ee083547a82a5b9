"""The head's training with DFlash's recipe (`HeadTask(cfg, "dflash")`): its exponential loss
weights, its random anchors, blocks of D positions drafting D - 1 tokens that the engine's
rounds replay exactly, a few steps through the training schedule (no Ray), and today's `head`
section on today's code path."""

from __future__ import annotations

import json
import math

import torch

from peftbd.config import load_config
from peftbd.decoding import BDHeadDrafter, SpeculativeDecoder
from peftbd.methods import method
from peftbd.models.loading import eos_token_ids, load_tokenizer
from peftbd.training.block_diffusion import (
    block_starts,
    build_draft_batch,
    prefix_weights,
    random_starts,
)
from peftbd.training.checkpoint import TrainState
from peftbd.training.deepspeed_config import batch_plan
from peftbd.training.examples import collate_sequences
from peftbd.training.head_objective import head_block_stats, head_drafts
from peftbd.training.head_task import HeadTask
from peftbd.training.rounds import replay_rounds
from peftbd.training.schedule import Schedule, WorkerData, train

from .conftest import ROUNDS_BUDGET as BUDGET
from .conftest import overfit

SMALL = [f"data.max_new_tokens={BUDGET}", "peftbd_head.block_size=8", "dflash.block_size=8"]


def _batch(lengths: list[int], prompt: int = 5):
    """Rows of random tokens: a `prompt`-token prompt and replies of `lengths` tokens."""
    gen = torch.Generator().manual_seed(0)
    rows = {"id": [f"r{i}" for i in range(len(lengths))],
            "prompt_ids": [torch.randint(10, 900, (prompt,), generator=gen).tolist()] * len(lengths),
            "continuation_ids": [torch.randint(10, 900, (n,), generator=gen).tolist() for n in lengths],
            "prompt_len": [prompt] * len(lengths)}
    return rows, collate_sequences(rows, pad_id=0)


def test_exp_decay_weighs_block_position_k_as_dflash():
    """DFlash (D = 16, gamma 7): block position k = 1..15 (0 is the anchor) weighs exp(-(k-1)/7)."""
    weights = prefix_weights(15, 0.9, decay=7.0)
    assert torch.allclose(weights, torch.tensor([math.exp(-(k - 1) / 7) for k in range(1, 16)]))
    # decay 0: today's linear prefix, bit for bit
    assert torch.equal(prefix_weights(16, 0.9), 0.9 ** torch.arange(16, dtype=torch.float64).float())
    _, batch = _batch([40])
    draft = build_draft_batch(batch, [[6, 9]], block_size=15, mask_id=1, pad_id=0, anchored=False,
                              gamma=0.9, t_range=(1.0, 1.0), seed=0, epoch=0, decay=7.0)
    assert torch.equal(draft.block_view(draft.weights)[0, 0], weights)


def test_random_anchors_count_range_and_determinism():
    rows, batch = _batch([300, 40, 1, 0])
    starts = random_starts(batch, 512, seed=0, epoch=3)
    assert [len(s) for s in starts] == [299, 39, 0, 0]  # min(512, n - P - 1): every start there is
    assert starts[0] == list(range(6, 305))
    few = random_starts(batch, 16, seed=0, epoch=3)
    assert [len(s) for s in few] == [16, 16, 0, 0]
    for row in few:
        assert row == sorted(set(row)) and all(6 <= s < 5 + 300 for s in row)
    assert few == random_starts(batch, 16, seed=0, epoch=3)  # a pure function of seed and epoch
    assert few != random_starts(batch, 16, seed=0, epoch=4)
    assert few != random_starts(batch, 16, seed=1, epoch=3)
    _, alone = _batch([300])  # a row's anchors do not depend on the rest of its batch
    assert random_starts(alone, 16, seed=0, epoch=3)[0] == few[0]


def test_the_head_section_takes_todays_path(tiny_world):
    """`head:` (block, prefix_gamma, block_stride): the loss of today's composition, bit for bit."""
    cfg = load_config("tiny", overrides=SMALL)
    task = HeadTask(cfg, "peftbd_head")
    head = task.build(torch.device("cpu"))
    _, batch = _batch([60, 33])
    assert task.draft_len == task.block_size == 8
    starts = block_starts(batch, 8, "random", cfg.training.seed, 2, cfg.peftbd_head.block_stride)
    draft = build_draft_batch(batch, starts, block_size=8, mask_id=task.mask_id, pad_id=task.pad_id,
                              anchored=False, gamma=cfg.peftbd_head.prefix_gamma, t_range=(1.0, 1.0),
                              seed=cfg.training.seed, epoch=2)
    want = head_block_stats(head, task.verifier, draft, cfg.training.logits_chunk_rows).loss
    assert torch.equal(task.train_loss(head, batch, epoch=2), want)


def test_dflash_cuts_d_position_blocks_at_random_anchors(tiny_world):
    cfg = load_config("tiny", overrides=SMALL)
    task = method("dflash").task(cfg)
    assert isinstance(task, HeadTask) and task.head_cfg == cfg.dflash
    assert task.draft_len == 7 and task.optim == cfg.dflash.optim
    head = task.build(torch.device("cpu"))
    assert head.shape.block_masks == "block_minus_one" and len(head.layers) == cfg.dflash.layers
    _, batch = _batch([60])
    loss = task.train_loss(head, batch, epoch=0)
    starts = random_starts(batch, cfg.dflash.anchors, cfg.training.seed, 0)
    draft = build_draft_batch(batch, starts, block_size=7, mask_id=task.mask_id, pad_id=task.pad_id,
                              anchored=False, gamma=0.9, t_range=(1.0, 1.0), seed=0, epoch=0,
                              decay=cfg.dflash.loss_decay)
    assert draft.chunk_ids.shape[1] == 59 * 8  # 59 anchors, blocks of D = 8 positions
    assert torch.equal(loss, head_block_stats(head, task.verifier, draft,
                                              cfg.training.logits_chunk_rows).loss)


def test_replayed_rounds_are_the_engines_d_minus_1_rounds(tiny_world, greedy_rows,
                                                          replay_is_the_engine):
    """Trained on the verifier's greedy rows, the DFlash head drafts, in `SpeculativeDecoder`,
    exactly the rounds the training layout replays: D - 1 = 7 tokens a round."""
    cfg = load_config("tiny", overrides=SMALL)
    task = method("dflash").task(cfg)
    tok = load_tokenizer(cfg)
    head = task.build(torch.device("cpu"))
    batch = collate_sequences(greedy_rows, tok.pad_token_id)
    losses = overfit(task, head, batch, steps=30, lr=4e-3)
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    with torch.no_grad():
        replayed = replay_rounds(head_drafts(head, task.verifier, batch, block_size=7,
                                             pad_id=task.pad_id), batch, budget=BUDGET, block_size=7)
    drafter = BDHeadDrafter(head, task.verifier, cfg.dflash.block_size)
    engine = SpeculativeDecoder(task.verifier, drafter, eos_token_ids(task.verifier, tok), BUDGET)
    results = [engine.decode(p) for p in greedy_rows["prompt_ids"]]
    replay_is_the_engine(task, head, batch, greedy_rows, replayed, results)
    assert max(r.proposed for res in results for r in res.rounds) == 7


def test_a_few_steps_of_the_dflash_task_through_the_schedule(ds_engine, tiny_world, greedy_rows,
                                                              tmp_path):
    cfg = load_config("tiny", overrides=[*SMALL, "training.micro_batch_size=1",
                                         "dflash.optim.global_batch_size=2", "dflash.optim.max_steps=3",
                                         "dflash.optim.eval_every=3"])
    task = method("dflash").task(cfg)
    engine = ds_engine(task.build(torch.device("cpu")), cfg, task.optim)
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters() if p.requires_grad}
    pad_id = load_tokenizer(cfg).pad_token_id
    rows = [{k: v[i : i + 1] for k, v in greedy_rows.items()} for i in range(6)]
    data = WorkerData(lambda: iter(rows), lambda r: collate_sequences(r, pad_id),
                      [collate_sequences(greedy_rows, pad_id)])
    schedule = Schedule.of(task.optim, batch_plan(cfg.training, task.optim, 1), 3, len(rows))
    losses: dict[int, float] = {}
    trained = train(engine, task, schedule, TrainState(), data, lambda *a, **k: None,
                    lambda done, total, loss: losses.__setitem__(done, loss))
    assert trained.steps_run == 3 and sorted(losses) == [1, 2, 3]
    assert all(math.isfinite(x) for x in losses.values())
    assert trained.metrics["eval_rounds"] > 0 and "eval_accepted_prefix_mean" in trained.metrics
    # the learning curve: a half of 3 steps (1) and the last; 16 val rows give an interval
    assert [p.step for p in trained.state.curve] == [1, 3]
    lo, hi = trained.metrics["eval_accepted_prefix_ci95"]
    assert trained.state.curve[-1].ci95 == (lo, hi)
    half, end = trained.state.curve  # both budget marks keep each val row's (accepted, rounds)
    assert len(half.rows) == len(end.rows) == 16
    assert [r > 0 for _, r in half.rows] == [r > 0 for _, r in end.rows]
    assert math.isclose(sum(a for a, _ in end.rows) / sum(r for _, r in end.rows),
                        end.accepted_prefix_mean)
    assert lo <= trained.metrics["eval_accepted_prefix_mean"] <= hi
    after = dict(engine.module.named_parameters())
    assert any(not torch.equal(after[n], p) for n, p in before.items())  # it trains
    task.export(engine.module, tmp_path)
    meta = json.loads((tmp_path / "bd_head" / "bd_head.json").read_text())
    assert meta["block_masks"] == "block_minus_one"
