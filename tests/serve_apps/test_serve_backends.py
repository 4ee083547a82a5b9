"""The ingress backends and the split round driver without a cluster: deployment handles faked
over in-process replicas, so the split rounds, retries after a lost replica (model replica or
round driver) and the clear error are checked in seconds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pickle
import time
from typing import Any

import pytest
from ray.exceptions import ActorDiedError

from peftbd.data.chat import encode_prompt
from peftbd.decoding import decode
from peftbd.serving.replica import ReplicaDecoder
from peftbd.serving.rounds import RoundEvent
from peftbd.serving.validation import GenerationSpec
from serve_apps.backends import BackendUnavailable, ColocatedBackend, SplitBackend, split_driver

MAX_NEW = 12


class FakeHandle:
    """A `DeploymentHandle` stand-in over one in-process replica. While `deaths` > 0, the replica
    dies in `dies_on`: a call from the third on fails with ActorDiedError (a stream fails after
    three items), and the death wipes its sessions (the retry meets a fresh replica). A stream's
    items cross pickled, as Ray sends them."""

    def __init__(self, replica: ReplicaDecoder, dies_on: str = "", deaths: int = 0) -> None:
        self.replica, self.dies_on, self.deaths, self.calls = replica, dies_on, deaths, 0

    def options(self, **_: Any) -> FakeHandle:
        return self

    def die(self) -> ActorDiedError:
        self.deaths -= 1
        if isinstance(self.replica, ReplicaDecoder):
            self.replica.sessions = type(self.replica.sessions)(4)
        return ActorDiedError()

    def __getattr__(self, method: str) -> Any:
        handle = self
        dying = method == self.dies_on and self.deaths > 0

        class Method:
            def remote(self, *args: Any) -> Any:
                handle.calls += 1
                if method == "rounds":
                    return _stream(handle, handle.replica.arounds(*args), dying)
                if method == "release":  # fire and forget: nobody awaits it
                    return handle.replica.release(*args)
                if dying and handle.calls >= 3:
                    return _raise(handle.die())
                return _value(getattr(handle.replica, method)(*args))

        return Method()


async def _value(value: Any) -> Any:
    return value


async def _raise(exc: Exception) -> Any:
    raise exc


async def _stream(handle: FakeHandle, events: Any, dying: bool) -> Any:
    i = 0
    async with contextlib.aclosing(events):
        async for event in events:
            if dying and i == 3:
                raise handle.die()
            i += 1
            yield pickle.loads(pickle.dumps(event))  # as Ray sends `Engine.rounds`' events


@pytest.fixture(scope="module")
def setup(tiny_cfg):
    from peftbd.models.loading import load_tokenizer
    from peftbd.serving.models import load_serving_models

    models = load_serving_models(tiny_cfg)
    tok = load_tokenizer(tiny_cfg)
    prompt = encode_prompt(tok, [{"role": "user", "content": "Count from 9 to 15."}])
    expected = decode(models.model, prompt, None, MAX_NEW, models.eos_ids).tokens
    return models, prompt, expected


def _spec(prompt: list[int], method: str, request_id: str = "r1") -> GenerationSpec:
    return GenerationSpec(request_id=request_id, kind="chat", model="m", method=method,
                          prompt_ids=prompt, max_new_tokens=MAX_NEW, stream=False,
                          include_usage=False)


def _collect(backend: Any, spec: GenerationSpec) -> tuple[list[int], int]:
    async def run() -> list:
        return [e async for e in backend.rounds(spec)]

    events = asyncio.run(run())
    return [t for e in events for t in e.tokens], sum(e.resumes for e in events)


@pytest.mark.parametrize("method", ["peftbd", "fastmtp", "peftbd_head"])
def test_split_rounds_survive_a_lost_drafter(tiny_cfg, setup, method):
    models, prompt, expected = setup
    drafter = FakeHandle(ReplicaDecoder(models, 4), dies_on="propose_batch", deaths=1)
    backend = split_driver(drafter, FakeHandle(ReplicaDecoder(models, 4)), tiny_cfg.serving)
    tokens, resumes = _collect(backend, _spec(prompt, method))
    assert tokens == expected and resumes == 1 and drafter.deaths == 0


def test_split_rounds_hand_the_verifier_features_to_the_head_drafter(tiny_cfg, setup, monkeypatch):
    """The ingress passes each prefill / verify reply's features to the next propose: the head's
    drafter replica runs no verifier forward at all, and usage counts the bytes."""
    models, prompt, expected = setup
    drafter = ReplicaDecoder(models, 4)
    monkeypatch.setattr(drafter, "release", lambda _sid: None)  # keep its session to look at
    backend = split_driver(FakeHandle(drafter), FakeHandle(ReplicaDecoder(models, 4)),
                           tiny_cfg.serving)

    async def run() -> list:
        return [e async for e in backend.rounds(_spec(prompt, "peftbd_head"))]

    events = asyncio.run(run())
    assert [t for e in events for t in e.tokens] == expected
    assert set(drafter.sessions.get("r1").state.forwards.calls) == {"draft"}
    assert events[0].feature_bytes > 0 and all(e.feature_bytes > 0 for e in events if not e.done)


def test_the_colocated_stream_carries_round_events_as_themselves(tiny_cfg, setup):
    """`Engine.rounds` yields `RoundEvent`s and the Ingress gets the same typed events (pickled
    by Ray, no dict in between): the replica's own steps, with only the ingress-side transport
    filled in."""
    models, prompt, expected = setup
    direct = ReplicaDecoder(models, 4)

    async def replica_steps() -> list[RoundEvent]:
        return [e async for e in direct.arounds(prompt, MAX_NEW, "fastmtp")]

    steps = asyncio.run(replica_steps())
    engine = FakeHandle(ReplicaDecoder(models, 4))

    async def run() -> list[RoundEvent]:
        backend = ColocatedBackend(engine, tiny_cfg.serving)
        return [e async for e in backend.rounds(_spec(prompt, "fastmtp"))]

    events = asyncio.run(run())
    assert all(type(e) is RoundEvent for e in events)
    assert [t for e in events for t in e.tokens] == expected
    untimed = lambda e: dataclasses.replace(  # noqa: E731
        e, draft_ms=0.0, verify_ms=0.0, sync_ms=0.0, other_ms=0.0, transport_ms=0.0)
    assert [untimed(e) for e in events] == [untimed(e) for e in steps]


def test_colocated_stream_resumes_on_a_new_engine(tiny_cfg, setup):
    models, prompt, expected = setup
    engine = FakeHandle(ReplicaDecoder(models, 4), dies_on="rounds", deaths=1)
    tokens, resumes = _collect(ColocatedBackend(engine, tiny_cfg.serving), _spec(prompt, "fastmtp"))
    assert tokens == expected and resumes == 1 and engine.deaths == 0


class _DriverReplica:
    """A `Rounds` replica stand-in: its `rounds` stream is the driver's (FakeHandle streams a
    replica's `arounds`)."""

    def __init__(self, driver: Any) -> None:
        self.arounds = driver.rounds


@pytest.mark.parametrize("method", ["ar", "peftbd", "peftbd_head"])
def test_a_split_request_resumes_on_a_new_round_driver(tiny_cfg, setup, method):
    """The Ingress streams a split request from the round driver; a driver lost after three
    steps is replaced and the request goes on from the tokens already sent (no second prefill),
    exactly."""
    models, prompt, expected = setup
    driver = split_driver(FakeHandle(ReplicaDecoder(models, 4)),
                          FakeHandle(ReplicaDecoder(models, 4)), tiny_cfg.serving)
    rounds = FakeHandle(_DriverReplica(driver), dies_on="rounds", deaths=1)

    async def run() -> list[RoundEvent]:
        return [e async for e in SplitBackend(rounds, tiny_cfg.serving).rounds(_spec(prompt, method))]

    events = asyncio.run(run())
    assert [t for e in events for t in e.tokens] == expected
    assert rounds.calls == 2 and rounds.deaths == 0 and sum(e.prefill for e in events) == 1


def test_the_round_driver_resumes_from_committed_tokens_without_a_prefill(tiny_cfg, setup):
    models, prompt, expected = setup
    verifier = ReplicaDecoder(models, 4)
    driver = split_driver(FakeHandle(ReplicaDecoder(models, 4)), FakeHandle(verifier),
                          tiny_cfg.serving)

    async def run() -> list[RoundEvent]:
        return [e async for e in driver.rounds(_spec(prompt, "fastmtp"), prompt + expected[:5])]

    events = asyncio.run(run())
    assert [t for e in events for t in e.tokens] == expected[5:]
    assert not any(e.prefill for e in events) and events[0].resumes >= 1


def test_a_replica_that_keeps_dying_gives_a_clear_error(tiny_cfg, setup):
    models, prompt, _ = setup
    verifier = FakeHandle(ReplicaDecoder(models, 4), dies_on="verify_batch", deaths=99)
    backend = split_driver(FakeHandle(ReplicaDecoder(models, 4)), verifier, tiny_cfg.serving)
    with pytest.raises(BackendUnavailable, match="Verifier replica .* lost 3 times"):
        _collect(backend, _spec(prompt, "peftbd"))


def test_closing_split_rounds_early_releases_both_sessions(tiny_cfg, setup):
    """A client that leaves (or a stop sequence) closes the rounds mid-request: the Drafter and
    Verifier sessions are released at once, not left for the LRU."""
    models, prompt, _ = setup
    drafter, verifier = ReplicaDecoder(models, 4), ReplicaDecoder(models, 4)
    backend = split_driver(FakeHandle(drafter), FakeHandle(verifier), tiny_cfg.serving)

    async def two_rounds() -> None:
        rounds = backend.rounds(_spec(prompt, "fastmtp"))
        for _ in range(2):
            await anext(rounds)
        assert len(drafter.sessions) == len(verifier.sessions) == 1
        await rounds.aclose()

    asyncio.run(two_rounds())
    assert len(drafter.sessions) == len(verifier.sessions) == 0


def _concurrent(backend: Any, specs: list[GenerationSpec]) -> list[list]:
    async def one(spec):
        return [e async for e in backend.rounds(spec)]

    async def run():
        return await asyncio.gather(*(one(s) for s in specs))

    return asyncio.run(run())


@pytest.mark.parametrize("method", ["ar", "peftbd", "fastmtp", "peftbd_head"])
def test_concurrent_split_requests_share_batched_calls_and_stay_exact(tiny_cfg, setup, method):
    """8 concurrent requests: the ingress gathers their rounds into batched Drafter / Verifier
    calls (fewer calls than requests x rounds), each request's transport is its share, and every
    output is exactly the engine's."""
    models, prompt, expected = setup
    drafter, verifier = ReplicaDecoder(models, 16), ReplicaDecoder(models, 16)
    dh, vh = FakeHandle(drafter), FakeHandle(verifier)
    backend = split_driver(dh, vh, tiny_cfg.serving)
    results = _concurrent(backend, [_spec(prompt, method, f"r{i}") for i in range(8)])
    assert all([t for e in r for t in e.tokens] == expected for r in results)
    assert sum(e.resumes for r in results for e in r) == 0
    assert max(verifier.batch_sizes) > 1 and max(e.batch_size for r in results for e in r) > 1
    rounds = sum(len(r) - 1 for r in results)
    assert sum(verifier.batch_sizes.values()) < rounds  # prefill + verify calls, batched
    if method != "ar":
        assert max(drafter.batch_sizes) > 1
    assert len(drafter.sessions) == len(verifier.sessions) == 0


@pytest.mark.parametrize("method", ["peftbd", "peftbd_head"])
def test_a_drafter_killed_under_concurrent_load_leaves_every_answer_exact(tiny_cfg, setup, method):
    models, prompt, expected = setup
    drafter = FakeHandle(ReplicaDecoder(models, 16), dies_on="propose_batch", deaths=1)
    backend = split_driver(drafter, FakeHandle(ReplicaDecoder(models, 16)), tiny_cfg.serving)
    results = _concurrent(backend, [_spec(prompt, method, f"r{i}") for i in range(6)])
    assert all([t for e in r for t in e.tokens] == expected for r in results)
    assert sum(e.resumes for r in results for e in r) >= 1 and drafter.deaths == 0


def test_an_engine_killed_under_concurrent_load_leaves_every_answer_exact(tiny_cfg, setup):
    models, prompt, expected = setup
    replica = ReplicaDecoder(models, 16)
    engine = FakeHandle(replica, dies_on="rounds", deaths=1)
    results = _concurrent(ColocatedBackend(engine, tiny_cfg.serving),
                          [_spec(prompt, "fastmtp", f"r{i}") for i in range(6)])
    assert all([t for e in r for t in e.tokens] == expected for r in results)
    assert sum(e.resumes for r in results for e in r) >= 1 and max(replica.batch_sizes) > 1


class ThreadedHandle(FakeHandle):
    """A `FakeHandle` whose batched calls run in a worker thread, as a Serve replica's sync
    methods do, recording each call's (start, end): a drafter and a verifier can overlap."""

    def __init__(self, replica: ReplicaDecoder) -> None:
        super().__init__(replica)
        self.spans: list[tuple[float, float]] = []

    def __getattr__(self, method: str) -> Any:
        handle = self

        class Method:
            def remote(self, *args: Any) -> Any:
                if method == "release":
                    return handle.replica.release(*args)
                return asyncio.to_thread(handle.timed, method, *args)

        return Method()

    def timed(self, method: str, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return getattr(self.replica, method)(*args)
        finally:
            self.spans.append((start, time.perf_counter()))


def _overlap_s(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


@pytest.mark.parametrize("groups", [1, 2])
def test_split_groups_overlap_drafting_with_verifying_and_stay_exact(tiny_cfg, setup, groups):
    """Two groups: the Drafter drafts one while the Verifier verifies the other (their calls
    overlap in time); one group is lockstep (they never overlap past the round wait). Either
    way every output is the engine's."""
    from peftbd.serving.models import load_serving_models

    models, prompt, expected = setup
    serving = dataclasses.replace(tiny_cfg.serving, split_groups=groups)
    # two processes' worth of models: the adapter switch is model-wide
    drafter = ThreadedHandle(ReplicaDecoder(load_serving_models(tiny_cfg), 16))
    verifier = ThreadedHandle(ReplicaDecoder(models, 16))
    backend = split_driver(drafter, verifier, serving)
    results = _concurrent(backend, [_spec(prompt, "peftbd", f"r{i}") for i in range(8)])
    assert all([t for e in r for t in e.tokens] == expected for r in results)
    overlap = _overlap_s(drafter.spans, verifier.spans)
    busy = sum(e - s for s, e in verifier.spans)
    if groups == 1:
        assert overlap < 0.05 * busy
    else:
        assert overlap > 0.2 * busy
        assert max(verifier.replica.batch_sizes) <= 4 + 1  # a group: half the requests

