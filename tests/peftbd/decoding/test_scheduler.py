"""The engine's scheduler (`peftbd.decoding.scheduler`): requests arriving in a burst are
prefilled a chunk per step while the running ones keep taking a round every step, and every
request still decodes its own batch-1 output."""

from __future__ import annotations

import pytest

from peftbd.decoding import SpeculativeDecoder
from peftbd.decoding.scheduler import Scheduler, Stepped


def _done(stepped: list[Stepped]) -> dict:
    return {s.key: s.state for s in stepped if s.done}


def test_a_burst_of_arrivals_never_stalls_the_rounds_in_flight(verifier, prompts):
    dec = SpeculativeDecoder(verifier, None, (), 64, prefill_chunk=16)  # no EOS: budgets end them
    rows = [ids for _, ids in prompts]
    scheduler = Scheduler(dec, 3)
    scheduler.add("first", rows[0][:10], 64)
    scheduler.step()  # its prompt fits one chunk: prefilled, and a round
    first = scheduler.running[0].state
    assert len(first.rounds) == 1
    for i, row in enumerate(rows[1:]):
        scheduler.add(i, row * 2, 4)  # a burst of long prompts: several chunks each
    chunks = -(-sum(2 * len(r) for r in rows[1:]) // 16)
    finished = {}
    for step in range(chunks):
        finished.update(_done(scheduler.step()))
        assert len(first.rounds) == 2 + step  # a round every step, the burst prefilling
    assert all(r.prefilled for r in scheduler.running)
    while scheduler.busy:
        finished.update(_done(scheduler.step()))
    assert chunks < 64
    alone = SpeculativeDecoder(verifier, None, (), 64)
    assert finished["first"].new_tokens == alone.decode(rows[0][:10]).tokens
    for i, row in enumerate(rows[1:]):
        assert finished[i].new_tokens == alone.decode(row * 2, 4).tokens


def test_each_request_reports_its_prefill_then_its_rounds_and_their_tokens(verifier, prompts):
    dec = SpeculativeDecoder(verifier, None, (), 64, prefill_chunk=8)
    rows = [ids for _, ids in prompts][:3]
    scheduler = Scheduler(dec, 2)  # the third waits for a row
    for i, row in enumerate(rows):
        scheduler.add(i, row, 5)
    seen: dict[int, list[Stepped]] = {i: [] for i in range(len(rows))}
    while scheduler.busy:
        for s in scheduler.step():
            seen[s.key].append(s)
            assert s.batch_size <= 2
    alone = SpeculativeDecoder(verifier, None, (), 64)
    for i, row in enumerate(rows):
        steps = seen[i]
        assert steps[0].prefill and not any(s.prefill for s in steps[1:])
        assert [s.done for s in steps] == [False] * (len(steps) - 1) + [True]
        assert [t for s in steps for t in s.tokens] == alone.decode(row, 5).tokens
    assert dec.pool.rows == 2  # the third request took a finished request's row


def test_a_resumed_request_continues_from_its_tokens_and_a_cancelled_one_frees_its_row(verifier, prompts):
    dec = SpeculativeDecoder(verifier, None, (), 64, prefill_chunk=8)
    row = [ids for _, ids in prompts][0]
    reference = SpeculativeDecoder(verifier, None, (), 64).decode(row, 9).tokens
    scheduler = Scheduler(dec, 2)
    scheduler.add("resumed", list(row) + reference[:4], 9, prompt_len=len(row))
    scheduler.add("leaving", row, 9)
    got: list[int] = []
    first = True
    while scheduler.busy:
        for s in scheduler.step():
            if s.key == "resumed":
                assert s.prefill == first and (not s.tokens) == first  # its prefill commits nothing
                first = False
                got += s.tokens
        if any(r.queued.key == "leaving" for r in scheduler.running):
            scheduler.cancel("leaving")
            assert [r.queued.key for r in scheduler.running] == ["resumed"]
            assert sum(dec.pool._owner(r) is not None for r in range(dec.pool.rows)) == 1
    assert reference[:4] + got == reference
    with pytest.raises(ValueError, match="prompt_len=0"):
        scheduler.add("bad", row, 9, prompt_len=0)
