"""Replica compute without Ray: colocated rounds and split propose/verify give exactly the
engine's greedy output, also when a replica loses a request's state mid-way (resume)."""

from __future__ import annotations

import dataclasses

import pytest

from peftbd.data.chat import encode_prompt
from peftbd.decoding import decode
from peftbd.serving.replica import ReplicaDecoder
from peftbd.serving.rounds import RequestStats, split_round
from peftbd.serving.schemas import METHODS
from peftbd.serving.sessions import Session, SessionStore

MAX_NEW = 16


@pytest.fixture(scope="module")
def models(tiny_cfg):
    from peftbd.serving.models import load_serving_models

    return load_serving_models(tiny_cfg)


@pytest.fixture(scope="module")
def prompt(tiny_cfg):
    from peftbd.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_cfg)
    return encode_prompt(tok, [{"role": "user", "content": "Describe the for statement."}])


@pytest.fixture(scope="module")
def reference(models, prompt):
    """The engine's greedy output (AR; every method must reproduce it)."""
    return decode(models.model, prompt, None, MAX_NEW, models.eos_ids).tokens


@pytest.mark.parametrize("method", METHODS)
def test_colocated_rounds_equal_the_engine(models, prompt, reference, method):
    events = list(ReplicaDecoder(models, 4).rounds(prompt, MAX_NEW, method))
    assert [t for e in events for t in e.tokens] == reference
    assert events[0].prefill and events[-1].done and events[-1].finish_reason in ("stop", "length")
    stats = RequestStats(method)
    for e in events:
        stats.add(e)
    summary = stats.summary()
    assert summary.rounds == len(events) - 1 and summary.resumes == 0
    assert summary.tokens_per_round == pytest.approx((len(reference) - 1) / summary.rounds, abs=1e-3)
    # what the per-position counters record = the engine's per_position of the same decode
    engine = models.decoder(method).decode(prompt, MAX_NEW).metrics["per_position"]
    for counted, positions in zip(("proposed", "accepted"), zip(*(e.positions() for e in events))):
        assert [sum(j in p for p in positions) for j in range(1, len(engine[counted]) + 1)] \
            == engine[counted]
        assert sum(map(len, positions)) == sum(engine[counted])


def _split(models, prompt, method, lose_at: int | None = None,
           drafter: ReplicaDecoder | None = None, drafts: list | None = None) -> tuple[list[int], int]:
    """Run the split protocol in-process; at round `lose_at` both replicas lose the session.
    `drafts` collects every proposal."""
    drafter, verifier = drafter or ReplicaDecoder(models, 4), ReplicaDecoder(models, 4)
    reply = verifier.prefill("s", prompt, MAX_NEW)
    committed, done, resumes, n = list(prompt) + reply["tokens"], reply["done"], 0, 0
    while not done:
        if n == lose_at:  # as a replaced replica would: no sessions (a release is for good)
            drafter.sessions, verifier.sessions = SessionStore(4), SessionStore(4)
        proposal = None
        if method != "ar":
            proposal = drafter.propose("s", committed, len(prompt), MAX_NEW, method)
            if drafts is not None:
                drafts.append(proposal["draft"])
        reply = verifier.verify("s", committed, len(prompt), MAX_NEW,
                                proposal["draft"] if proposal else [])
        event = split_round(proposal, 5.0, reply, 5.0)
        committed += event.tokens
        done, resumes, n = event.done, resumes + event.resumes, n + 1
    return committed[len(prompt):], resumes


@pytest.mark.parametrize("method", METHODS)
def test_split_protocol_equals_the_engine_and_survives_lost_state(models, prompt, reference, method):
    tokens, resumes = _split(models, prompt, method)
    assert tokens == reference and resumes == 0
    tokens, resumes = _split(models, prompt, method, lose_at=2)
    assert tokens == reference
    assert resumes == (1 if method == "ar" else 2)


def test_split_early_exit_drafter_syncs_only_its_layers_and_drafts_the_same(
        tiny_cfg, prompt, reference, monkeypatch):
    from peftbd.serving.models import load_serving_models

    cfg = dataclasses.replace(tiny_cfg, drafter=dataclasses.replace(tiny_cfg.drafter, draft_layers=1))
    models = load_serving_models(cfg)  # an untrained early-exit adapter: the first layer's exit
    assert models.decoder("peft-bd").drafter.kv_layers == 1
    replica, truncated = ReplicaDecoder(models, 4), []
    tokens, _ = _split(models, prompt, "peft-bd", drafter=replica, drafts=truncated)
    assert tokens == reference
    cache = replica.sessions.get("s").state.cache  # the drafter replica synced 1 of 2 layers
    assert cache.layers[0].keys.shape[-2] > cache.layers[1].keys.shape[-2]

    monkeypatch.setattr(models.decoder("peft-bd").drafter, "kv_layers", None)  # sync every layer
    full = []
    assert _split(models, prompt, "peft-bd", drafts=full)[0] == reference
    assert truncated == full and any(truncated)


def test_colocated_resume_from_committed_tokens(models, prompt, reference):
    done_part = list(prompt) + reference[:5]
    events = list(ReplicaDecoder(models, 4).rounds(prompt, MAX_NEW, "fastmtp", committed=done_part))
    assert events[0].tokens == [] and events[0].resumes == 1
    assert reference[:5] + [t for e in events for t in e.tokens] == reference


def test_session_store_evicts_least_recently_used(models, prompt):
    store = SessionStore(2)
    dec = models.decoder("ar")
    for sid in ("a", "b"):
        store.put(sid, Session(dec.start(prompt, 2)))
    assert store.get("a") is not None  # "a" becomes most recently used
    store.put("c", Session(dec.start(prompt, 2)))
    assert (store.get("b"), len(store)) == (None, 2)
    with pytest.raises(ValueError, match="max_sessions"):
        SessionStore(0)


def test_a_released_session_cannot_come_back(models, prompt):
    """A call of an abandoned request still running when its release arrived does not put the
    session back (the release may overtake it)."""
    store = SessionStore(2)
    store.drop("gone")
    store.put("gone", Session(models.decoder("ar").start(prompt, 2)))
    assert (store.get("gone"), len(store)) == (None, 0)


def test_a_colocated_loop_closed_early_ends_its_stream(models, prompt):
    replica = ReplicaDecoder(models, 4)
    loop = replica.rounds(prompt, MAX_NEW, "peft-bd")
    next(loop), next(loop)
    assert replica.streams == 1
    loop.close()  # the client left
    assert replica.streams == 0
