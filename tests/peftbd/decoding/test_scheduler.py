"""The engine's scheduler (`peftbd.decoding.scheduler`): requests arriving in a burst are
prefilled a chunk per step while the running ones keep taking a round every step, and every
request still decodes its own batch-1 output."""

from __future__ import annotations

from peftbd.decoding import SpeculativeDecoder
from peftbd.decoding.scheduler import Scheduler


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
        finished.update(scheduler.step())
        assert len(first.rounds) == 2 + step  # a round every step, the burst prefilling
    assert all(r.prefilled for r in scheduler.running)
    while scheduler.busy:
        finished.update(scheduler.step())
    assert chunks < 64
    alone = SpeculativeDecoder(verifier, None, (), 64)
    assert finished["first"].new_tokens == alone.decode(rows[0][:10]).tokens
    for i, row in enumerate(rows[1:]):
        assert finished[i].new_tokens == alone.decode(row * 2, 4).tokens
