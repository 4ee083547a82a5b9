"""Batched decoding: every row of a batch decodes exactly its own batch-1 greedy output, with every
drafter, at several batch sizes, rows of different lengths and budgets joining late."""

from __future__ import annotations

import copy

import dataclasses
import random

import pytest
import torch

from peftbd.decoding import BDHeadDrafter, MTPDrafter, NoDrafter, PeftBDDrafter, SpeculativeDecoder
from peftbd.decoding.ragged import RaggedKV, RowCache, pack
from peftbd.models.bd_head import BDHead, HeadShape
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import attach_drafter_adapter

BUDGETS = [24, 7, 31, 16, 1, 28]


@pytest.fixture(scope="module")
def rows(prompts, tokenizer) -> list[list[int]]:
    """Six prompts of different lengths (corpus prompts and cuts of them)."""
    base = [ids for _, ids in prompts]
    return base + [base[0][:9], base[1] + base[2][-5:], base[2][:3]]


class Perturbed(NoDrafter):
    """Proposes each request's own AR continuation with a wrong token at a random place each
    round: rows accept different prefixes every round (seeded by the row's length, so batch 1
    and batch B agree)."""

    name = "perturbed"

    def __init__(self, truth: dict[tuple[int, ...], list[int]], block: int) -> None:
        self.truth, self.block = truth, block

    def propose(self, states, max_tokens):
        out = []
        for state, m in zip(states, max_tokens):
            truth = self.truth[tuple(state.tokens[: state.prompt_len])]
            done = len(state.new_tokens)
            draft = list(truth[done : done + min(self.block, m)])
            wrong = random.Random(len(state.tokens)).randrange(self.block + 1)
            if wrong < len(draft):
                draft[wrong] = (draft[wrong] + 1) % 2000
            out.append(torch.tensor([draft], dtype=torch.long))
        return out


@pytest.fixture(scope="module")
def drafters(tiny_cfg, tokenizer, verifier, rows, eos):
    """Every drafter family on one adapter-carrying verifier (untrained drafters: still exact)."""
    from peftbd.models.loading import load_verifier

    torch.manual_seed(0)
    model = attach_drafter_adapter(load_verifier(tiny_cfg), tiny_cfg.peftbd, tokenizer.mask_token_id)
    early = attach_drafter_adapter(load_verifier(tiny_cfg), dataclasses.replace(
        tiny_cfg.peftbd, draft_layers=1), tokenizer.mask_token_id)  # drafts through layer 0 only
    mask = tokenizer.mask_token_id
    head = BDHead(model, HeadShape.of(tiny_cfg.peftbd_head, model.config, mask))
    ar = SpeculativeDecoder(verifier, None, eos, 64)
    truth = {tuple(p): ar.decode(p, 64).tokens for p in rows}
    return model, {
        "ar": None,
        "perturbed": Perturbed(truth, 6),
        "peftbd": PeftBDDrafter(model, mask, 8),
        "peftbd_2step": PeftBDDrafter(model, mask, 8, denoise_steps=2),
        "peftbd_anchored": PeftBDDrafter(model, mask, 8, anchored=True),
        "peftbd_early_exit": PeftBDDrafter(early, mask, 8),
        "fastmtp": MTPDrafter(MTPHead(model), model, num_steps=3),
        "peftbd_head": BDHeadDrafter(head, model, 8),
        "peftbd_head_vocab": BDHeadDrafter(head, model, 8, vocab_ids=torch.arange(3, 400)),
    }


@pytest.mark.parametrize("name", ["ar", "perturbed", "peftbd", "peftbd_2step", "peftbd_anchored",
                                  "peftbd_early_exit", "fastmtp", "peftbd_head", "peftbd_head_vocab"])
def test_every_row_decodes_its_own_batch_1_output(drafters, rows, eos, name):
    model, by_name = drafters
    drafter = by_name[name]
    dec = SpeculativeDecoder(getattr(drafter, "model", model), drafter, eos)
    single = [dec.decode(p, n) for p, n in zip(rows, BUDGETS)]
    for batch_size in (2, 4, 6):
        batched = dec.decode_many(rows, batch_size, BUDGETS)
        assert [r.tokens for r in batched] == [r.tokens for r in single], (name, batch_size)
        assert [[(x.proposed, x.accepted, x.emitted) for x in r.rounds] for r in batched] == \
            [[(x.proposed, x.accepted, x.emitted) for x in r.rounds] for r in single]


def test_rows_accept_different_prefixes_in_one_round(drafters, rows, eos):
    model, by_name = drafters
    dec = SpeculativeDecoder(model, by_name["perturbed"], eos, 32)
    states = dec.start_many(rows[:4])
    spread = set()
    while not all(s.done for s in states):
        live = [s for s in states if not s.done]
        spread.add(len({r.accepted for r in dec.step_many(live)}))
    assert max(spread) > 1  # the test exercises ragged acceptance, not lockstep rows


def test_a_row_joining_late_decodes_its_own_output(drafters, rows, eos):
    model, by_name = drafters
    for name in ("peftbd", "fastmtp", "peftbd_head"):
        dec = SpeculativeDecoder(model, by_name[name], eos, 40)
        want = [dec.decode(p).tokens for p in rows[:2]]
        first = dec.start(rows[0])
        for _ in range(3):
            if not first.done:
                dec.step(first)
        second = dec.start(rows[1])
        while not (first.done and second.done):
            dec.step_many([s for s in (first, second) if not s.done])
        assert [first.new_tokens, second.new_tokens] == want, name


def test_one_batched_round_is_one_verify_forward_per_row(drafters, rows, eos):
    model, by_name = drafters
    dec = SpeculativeDecoder(model, by_name["peftbd_2step"], eos, 20)
    states = dec.start_many(rows[:3])
    dec.step_many(states)
    for state in states:
        assert state.forwards.calls == {"prefill": 1, "draft": 2, "verify": 1}
    assert len({s.forwards.seconds["verify"] for s in states}) == 1  # one call, counted whole


def test_decode_many_rejects_a_bad_batch_size_and_budget_list(drafters, rows, eos):
    model, _ = drafters
    dec = SpeculativeDecoder(model, None, eos, 8)
    with pytest.raises(ValueError, match="batch_size"):
        dec.decode_many(rows, 0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.decode_many(rows, 2, [4, 4])


def test_pack_reuses_a_running_batch_and_swaps_rows_of_a_new_one_in_place():
    device = torch.device("cpu")
    pool = RaggedKV([], device)
    a, b, c = (RowCache.empty(pool) for _ in range(3))
    pack([a, b])
    pool.open_chunk(None, 3)
    pool.write(torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4), 0)
    pool.commit([3, 2])
    keys = {id(x): x.committed()[0][0].clone() for x in (a, b)}
    buffer, allocations = pool.keys[0], pool.allocations
    assert pack([a, b]) is pool and (a.row, b.row) == (0, 1)  # the running batch: nothing moves
    assert pack([b, a]) is pool and (b.row, a.row) == (0, 1)  # another order: rows swapped
    assert pool.lengths == [2, 3] and pool.keys[0] is buffer and pool.allocations == allocations
    for x in (a, b):
        assert torch.equal(x.committed()[0][0], keys[id(x)])
    pack([c, a])  # a request joins: it takes a row, the batch condenses
    assert (c.row, a.row) == (0, 1) and pool.lengths == [0, 3]
    del b, x  # a finished request gives its row back
    d = RowCache.empty(pool)
    assert d.row == 2 and pool.rows == 4


def test_a_cache_of_another_pool_moves_in_and_a_copy_takes_a_row_of_the_same_pool():
    device = torch.device("cpu")
    mine, other = RaggedKV([], device), RaggedKV([], device)
    a, b = RowCache.empty(mine), RowCache.empty(other)
    b.append([(torch.ones(1, 1, 5, 4), torch.ones(1, 1, 5, 4))])
    assert pack([a, b]) is mine and b.kv is mine and mine.lengths == [0, 5]
    assert torch.equal(b.committed()[0][0], torch.ones(1, 1, 5, 4))
    twin = copy.deepcopy(b)
    assert twin.kv is mine and twin.row not in (a.row, b.row)
    assert torch.equal(twin.committed()[0][0], b.committed()[0][0])


def test_chunk_mask_sees_committed_and_real_slots_only():
    kv = RaggedKV([2, 0], torch.device("cpu"))
    valid = torch.tensor([[True, True, True], [True, False, False]])
    kv.open_chunk(valid, 3)
    mask = kv.chunk_mask(None, torch.float32)[:, 0] == 0  # allowed
    assert mask.shape == (2, 3, 5)
    assert mask[0].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert mask[1].tolist() == [[1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]]


def test_a_forward_writes_the_open_chunk_only():
    """`write` relies on `open_chunk` (where the chunk goes, what its mask is): a forward without
    one, or of another width, is an error, not a silent misplacement."""
    kv, key = RaggedKV([2], torch.device("cpu")), torch.zeros(1, 1, 2, 4)
    with pytest.raises(RuntimeError, match="open chunk has none: open_chunk first"):
        kv.write(key, key, 0)
    kv.open_chunk(None, 3)
    with pytest.raises(RuntimeError, match="a chunk of 2 slots, but the open chunk has 3"):
        kv.write(key, key, 0)
    kv.drop()
    kv.open_chunk(None, 2)
    assert kv.write(key, key, 0)[0].shape == (1, 1, 4, 4) and kv.extent() == (2, 4)


def test_a_pool_sized_for_a_run_is_allocated_once_and_grows_no_more(drafters, rows, eos):
    """`reserve` (the benchmark's: every pass's rows and longest request) sizes the verifier's
    KV pool once: batch-1 decodes of prompts of every length and a batched pass after them meet
    no growth, so no new static address (which would compile new graphs, record new CUDA graphs)."""
    model, _ = drafters
    dec = SpeculativeDecoder(model, None, eos, 12)
    dec.reserve(3, max(map(len, rows)) + 12)
    dec.decode(rows[0])
    pool, held = dec.pool, (dec.pool.keys[0], dec.pool.allocations, dec.pool.rows)
    for row in sorted(rows, key=len):  # longer and longer prompts
        dec.decode(row)
    dec.decode_many(rows, 3)
    assert (pool.keys[0], pool.allocations, pool.rows) == held and held[2] == 3
    unreserved = SpeculativeDecoder(model, None, eos, 12)
    for row in sorted(rows, key=len):
        unreserved.decode(row)
    unreserved.decode_many(rows, 3)
    assert unreserved.pool.allocations > len(unreserved.pool.keys)  # grew after its first write
