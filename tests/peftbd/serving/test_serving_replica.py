"""Replica compute without Ray: colocated rounds, and a split Verifier's rounds drafting through a
Drafter replica, give exactly the engine's greedy output, also when a replica loses a request's
state mid-way (resume)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from peftbd.data.chat import encode_prompt
from peftbd.decoding import advance_shipped, decode, new_state
from peftbd.methods import serving_names
from peftbd.serving.features import KVBlock
from peftbd.serving.replica import ReplicaDecoder
from peftbd.serving.rounds import RequestStats
from peftbd.serving.sessions import Session, SessionStore, from_shipped

from .split_local import LocalCalls, split_decode

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


@pytest.mark.parametrize("method", serving_names())
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
           drafter: ReplicaDecoder | None = None, oracle: list[int] | None = None,
           on_round=None, verifier=None) -> tuple[list[int], int, list, LocalCalls]:
    """The split app in-process (`split_local`): a Verifier's scheduler over `verifier` (default:
    `models`) drafting through `drafter` (default: a replica of `models`); the Verifier is lost
    at round `lose_at`; `oracle` replaces the drafts; `on_round(n, calls)` runs before round n.
    (new tokens, rebuilds counted by the events, the events, the calls made)."""
    calls = LocalCalls(drafter or ReplicaDecoder(models, 4), oracle)
    hook = None if on_round is None else (lambda n: on_round(n, calls))
    tokens, events = split_decode(verifier or models, calls, prompt, method, MAX_NEW,
                                  lose_at=lose_at, on_round=hook)
    return tokens, sum(e.resumes for e in events), events, calls


@pytest.mark.parametrize("method", serving_names())
def test_split_protocol_equals_the_engine_and_survives_lost_state(models, prompt, reference, method):
    tokens, resumes, _, _ = _split(models, prompt, method)
    assert tokens == reference and resumes == 0
    tokens, resumes, _, _ = _split(models, prompt, method, lose_at=2)
    assert tokens == reference
    assert resumes == (1 if method == "ar" else 2)  # the Verifier's resume, the Drafter's rebuild


def test_split_early_exit_drafter_syncs_only_its_layers_and_drafts_the_same(
        tiny_cfg, prompt, reference, monkeypatch):
    from peftbd.serving.models import load_serving_models

    cfg = tiny_cfg.with_section("peftbd", dataclasses.replace(tiny_cfg.peftbd, draft_layers=1))
    models = load_serving_models(cfg)  # an untrained early-exit adapter: the first layer's exit
    assert models.decoder("peftbd").drafter.reads_kv_layers == 1
    tokens, _, _, calls = _split(models, prompt, "peftbd")
    assert tokens == reference
    truncated = calls.drafts
    # the drafter replica keeps 1 of 2 layers, of every position: the verifier shipped them all
    state = calls.session().state
    ((k0, _),) = state.cache.committed()
    assert k0.shape[2] == len(state.tokens) - 1 and set(state.forwards.calls) == {"draft"}

    monkeypatch.setattr(models.decoder("peftbd").drafter, "reads_kv_layers", None)  # every layer
    tokens, _, _, calls = _split(models, prompt, "peftbd")
    assert tokens == reference
    assert truncated == calls.drafts and any(truncated)


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
    loop = replica.rounds(prompt, MAX_NEW, "peftbd")
    next(loop), next(loop)
    assert replica.streams == 1
    loop.close()  # the client left
    assert replica.streams == 0


HEAD = "peftbd_head"


def _row_bytes(models) -> int:
    """Bytes of one position's features: m feature layers x d x the verifier's itemsize."""
    layers = models.decoder(HEAD).drafter.feature_layers
    p = next(models.model.parameters())
    return len(layers) * models.model.config.hidden_size * p.element_size()


def test_split_head_drafts_from_transported_features_without_a_verifier_forward(
        models, prompt, reference):
    """Oracle drafts make the verifier accept whole blocks, so features of several positions
    cross per round; the drafter replica never runs the verifier, and its head cache equals the
    one built from a single verifier prefill over the same tokens."""
    tokens, resumes, events, calls = _split(models, prompt, HEAD, oracle=reference)
    assert tokens == reference and resumes == 0
    state = calls.session().state
    assert set(state.forwards.calls) == {"draft"}  # no prefill, no sync: features only
    assert max(len(e.tokens) for e in events[1:]) > 1  # multi-position feature blocks crossed

    dec = models.decoder(HEAD)
    fresh = dec.start(state.tokens[:-1], 1)  # one prefill: the features of every position
    fresh.tokens = list(state.tokens)
    dec.drafter.propose([fresh], [1])  # injects them all
    got, want = state.drafter_state.committed(), fresh.drafter_state.committed()
    for (k0, v0), (k1, v1) in zip(got, want, strict=True):
        assert k0.shape == k1.shape
        assert torch.allclose(k0, k1, atol=1e-4) and torch.allclose(v0, v1, atol=1e-4)


@pytest.mark.parametrize("method", [HEAD, "fastmtp", "peftbd"])
def test_split_drafts_from_shipped_state_equal_the_colocated_ones(models, prompt, reference, method):
    """The Verifier ships what each drafter reads (features, final hidden states, KV), its
    prefill of every prompt position: the Drafter runs no verifier forward, not even a prefill,
    and drafts what colocated does."""
    dec, colocated = models.decoder(method), []
    state = dec.start(prompt, MAX_NEW)
    while not state.done:
        colocated.append(dec.propose(state)[0].tolist())
        dec.verify(state, colocated[-1])
    tokens, _, _, calls = _split(models, prompt, method)
    assert tokens == reference and calls.drafts == colocated
    assert set(calls.session().state.forwards.calls) == {"draft"}


def test_forward_sync_runs_the_drafters_own_verifier_forward(tiny_cfg, prompt, reference):
    from peftbd.serving.models import load_serving_models

    cfg = dataclasses.replace(tiny_cfg, serving=dataclasses.replace(tiny_cfg.serving,
                                                                    drafter_sync="forward"))
    models = load_serving_models(cfg)
    assert HEAD in models.shipped and set(models.shipped.values()) == {"features"}
    for method in ("fastmtp", "peftbd"):
        tokens, _, events, calls = _split(models, prompt, method)
        assert tokens == reference and sum(e.feature_bytes for e in events) == 0
        assert calls.session().state.forwards.calls["sync"] == len(events) - 2


def _bytes_per_position(models, method: str) -> int:
    """What the Verifier ships per cached position (`ServingModels.shipped`): a head's m
    features, FastMTP's final hidden state, PEFT-BD's keys and values of every layer."""
    c, size = models.model.config, next(models.model.parameters()).element_size()
    kind = models.shipped[method]
    if kind == "features":
        return len(models.decoder(method).drafter.feature_layers) * c.hidden_size * size
    if kind == "hidden":
        return c.hidden_size * size
    return c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * size


def test_shipped_bytes_are_counted_per_method(models, prompt, reference):
    assert _bytes_per_position(models, HEAD) == 2 * 192 * 4  # tiny: m = 2, d = 192, float32
    for method in serving_names():
        _, _, events, _ = _split(models, prompt, method)
        stats = RequestStats(method)
        for e in events:
            stats.add(e)
        rounds = sum(len(e.tokens) for e in events[1:] if not e.done)
        kind = models.shipped.get(method)
        rows = rounds + (len(prompt) if kind else 0)  # the first propose ships every prompt position
        want = 0 if kind is None else rows * _bytes_per_position(models, method)  # none: tokens only
        assert stats.summary().feature_bytes == want, method
    colocated = list(ReplicaDecoder(models, 4).rounds(prompt, MAX_NEW, HEAD))
    assert sum(e.feature_bytes for e in colocated) == 0


def test_split_head_resumes_exactly_after_a_lost_or_stale_drafter_session(models, prompt, reference):
    """A dropped drafter session is rebuilt by a prefill of the drafter's own verifier copy; a
    session several rounds behind (an earlier replica's) is not advanced with the wrong features."""
    kept: dict = {}

    def lose(n, calls):
        if n == 2:
            calls.drafter.sessions = SessionStore(4)

    tokens, resumes, _, calls = _split(models, prompt, HEAD, on_round=lose)
    assert tokens == reference and resumes == 1
    counted = calls.session().state.forwards.calls
    assert counted["prefill"] == 1 and "sync" not in counted

    def stale(n, calls):
        if n == 1:
            kept["s"] = copy.deepcopy(calls.session())
        if n == 3:  # back to a replica whose session stopped two rounds ago
            calls.drafter.sessions = SessionStore(4)
            calls.drafter.sessions.put(calls.items[-1].session_id, kept["s"])

    tokens, resumes, _, _ = _split(models, prompt, HEAD, on_round=stale)
    assert tokens == reference and resumes == 1


def test_features_of_another_head_are_a_clear_error(models, prompt):
    first = _split(models, prompt, HEAD)[3].items[0]  # the features of every prompt position
    block = dataclasses.replace(first.shipped, layers=(0,))
    with pytest.raises(ValueError, match="same peftbd_head_dir"):
        ReplicaDecoder(models, 4).propose_batch([dataclasses.replace(first, shipped=block)])


def test_feature_block_round_trips_in_its_dtype():
    from peftbd.serving.features import FeatureBlock

    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(1, 3, 8).to(dtype)
        block = FeatureBlock.encode(x, (1, 2), start=5)
        assert (block.nbytes, block.end, block.dtype) == (3 * 8 * x.element_size(), 8,
                                                          str(dtype)[6:])
        assert torch.equal(block.decode(), x)
    with pytest.raises(ValueError, match="needs 32"):
        dataclasses.replace(block, rows=4).decode()


def test_kv_block_round_trips_every_layer():
    from peftbd.serving.features import KVBlock

    kv = [(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)) for _ in range(5)]
    block = KVBlock.encode(kv, start=7)
    assert (block.rows, block.layers, block.end, block.nbytes) == (3, 5, 10, 5 * 2 * 2 * 3 * 4 * 4)
    for (k0, v0), (k1, v1) in zip(kv, block.decode(), strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_a_saved_head_serves_split_with_its_own_feature_layers(tiny_cfg, models, prompt, reference,
                                                              tmp_path):
    """`peftbd_head_dir`: the Drafter loads the head, the Verifier (AR only, as deployed) keeps the
    feature layers its saved shape records, not `cfg.peftbd_head`'s."""
    from peftbd.models.bd_head import BDHead, HeadShape
    from peftbd.serving.models import load_serving_models

    shape = HeadShape(1, 64, (0, 2), models.decoder(HEAD).drafter.head.shape.mask_id)
    torch.manual_seed(0)
    BDHead(models.model.get_base_model(), shape).save_pretrained(tmp_path / "bd_head")
    drafter = load_serving_models(tiny_cfg, (HEAD,), {HEAD: tmp_path})
    verifier = load_serving_models(tiny_cfg, ("ar",), {HEAD: tmp_path})
    assert drafter.decoder(HEAD).drafter.feature_layers == (0, 2) != tuple(tiny_cfg.peftbd_head.feature_layers)
    assert verifier.feature_layers[HEAD] == (0, 2)
    tokens, resumes, _, calls = _split(drafter, prompt, HEAD, verifier=verifier)
    assert tokens == reference and resumes == 0
    assert set(calls.session().state.forwards.calls) == {"draft"}


def test_a_prefill_block_that_does_not_cover_the_prompt_is_refused(models, prompt):
    """`from_shipped` needs every position before the last committed token; `advance_shipped`
    refuses KV that would leave the cache short of them, naming the counts."""
    dec = models.decoder("peftbd")
    state = dec.start(prompt, MAX_NEW)
    committed = list(state.tokens)
    whole = KVBlock.encode(state.cache.committed(), 0)
    assert from_shipped(dec, committed, len(prompt), MAX_NEW, whole).cache.get_seq_length() == len(prompt)
    short = KVBlock.encode([(k[:, :, 1:], v[:, :, 1:]) for k, v in state.cache.committed()], 1)
    with pytest.raises(ValueError, match=r"positions 1\.\.\d+ cannot start"):
        from_shipped(dec, committed, len(prompt), MAX_NEW, short)
    fresh = new_state(dec.model, committed[:-1], MAX_NEW)
    with pytest.raises(ValueError, match=f"covers {len(prompt) - 1} positions and the cache holds 0"):
        advance_shipped(fresh, committed[-1:], kv=short.decode())
