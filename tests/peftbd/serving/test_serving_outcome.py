"""usage.speculative counts what the client received: a stop sequence that ends the text inside
a round leaves the rest of that round (and the draft tokens accepted there) uncounted."""

from __future__ import annotations

import pytest

from peftbd.serving.outcome import RequestOutcome
from peftbd.serving.rounds import RequestStats, RoundEvent


@pytest.fixture(scope="module")
def tok(tiny_cfg):
    from peftbd.models.loading import load_tokenizer

    return load_tokenizer(tiny_cfg)


def _events(ids: list[int]) -> list[RoundEvent]:
    """Prefill (1 token), then rounds of 6 tokens each: 5 accepted draft tokens + the bonus."""
    events = [RoundEvent(tokens=ids[:1], prefill=True, other_ms=3.0)]
    for i in range(1, len(ids), 6):
        chunk = ids[i:i + 6]
        events.append(RoundEvent(tokens=chunk, proposed=5, accepted=min(5, len(chunk)),
                                 draft_ms=1.0, verify_ms=2.0, done=i + 6 >= len(ids)))
    return events


def _serve(tok, events: list[RoundEvent], stop: tuple[str, ...]) -> tuple[str, RequestOutcome, list]:
    outcome, text, observed = RequestOutcome(tok, "peftbd", stop), "", []
    for event in events:
        delta, received = outcome.push(event)
        text += delta
        observed.append(received)
        if outcome.stopped:
            return text, outcome, observed
    return text + outcome.finish(), outcome, observed


def test_a_stop_inside_a_round_counts_only_the_tokens_returned(tok):
    ids = tok("one two three four five six seven STOP eight nine ten eleven twelve thirteen",
              add_special_tokens=False)["input_ids"]
    probe = RequestOutcome(tok, "ar", ("STOP",))
    for t in ids:
        probe.push(RoundEvent(tokens=[t]))
        if probe.stopped:
            break
    n = probe.completion_tokens  # the token that completes "STOP" is ids[n - 1]
    assert 4 < n < len(ids) - 4
    # prefill; a round of n - 3 tokens; a round of 6 (5 accepted + bonus) whose 2nd token
    # completes the stop; a round after it that is never asked for
    first = ids[1:n - 2]
    events = [RoundEvent(tokens=ids[:1], prefill=True, other_ms=3.0),
              RoundEvent(tokens=first, proposed=len(first), accepted=len(first) - 1),
              RoundEvent(tokens=ids[n - 2:n + 4], proposed=5, accepted=5),
              RoundEvent(tokens=ids[n + 4:n + 6], proposed=5, accepted=1, done=True)]
    text, outcome, observed = _serve(tok, events, ("STOP",))
    assert text == "one two three four five six seven " and outcome.finish_reason == "stop"
    assert outcome.completion_tokens == n and len(observed) == 3
    assert (observed[-1].tokens, observed[-1].accepted) == (ids[n - 2:n], 2)
    spec = outcome.stats.summary()
    assert (spec.rounds, spec.proposed_tokens) == (2, len(first) + 5)
    # tokens per round and accepted tokens: exactly the returned tokens after prefill's one
    assert spec.tokens_per_round == pytest.approx((n - 1) / 2)
    assert spec.accepted_tokens == len(first) - 1 + 2
    # before: the round that completed the stop counted whole (4 tokens, 3 accepted more)
    raw = RequestStats("peftbd")
    for e in events[:3]:
        raw.add(e)
    assert raw.summary().tokens_per_round == pytest.approx((n - 1 + 4) / 2)
    assert raw.summary().accepted_tokens == spec.accepted_tokens + 3


def test_without_a_stop_every_token_counts(tok):
    ids = tok("alpha beta gamma delta epsilon zeta eta theta", add_special_tokens=False)["input_ids"]
    events = _events(ids)
    text, outcome, observed = _serve(tok, events, ("never",))
    assert text == tok.decode(ids) and outcome.finish_reason == "length"
    assert observed == events and outcome.completion_tokens == len(ids)
    spec = outcome.stats.summary()
    assert spec.tokens_per_round == pytest.approx(round((len(ids) - 1) / spec.rounds, 4))
    assert spec.prefill_ms == 3.0 and spec.draft_ms == spec.rounds * 1.0


def test_received_keeps_a_step_whole_or_cuts_its_tokens_and_accepted():
    event = RoundEvent(tokens=[1, 2, 3, 4], proposed=5, accepted=3)
    assert event.received(4) is event and event.received(9) is event
    assert (event.received(2).tokens, event.received(2).accepted) == ([1, 2], 2)
    assert (event.received(3).tokens, event.received(3).accepted) == ([1, 2, 3], 3)
    assert event.received(2).proposed == 5  # the draft was still proposed (its cost paid)
    assert [list(p) for p in event.received(2).positions()] == [[1, 2, 3, 4, 5], [1, 2]]
