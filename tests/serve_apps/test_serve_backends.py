"""The ingress backends and the split Verifier's calls to its Drafter without a cluster: deployment
handles faked over in-process replicas, so the split rounds, retries after a lost replica (Drafter,
Verifier or Engine) and the clear error are checked in seconds."""

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
from peftbd.serving.busy_lock import BusyLock
from peftbd.serving.replica import ReplicaDecoder
from peftbd.serving.roles import Role
from peftbd.serving.rounds import RoundEvent
from peftbd.serving.validation import GenerationSpec
from serve_apps.backends import BackendUnavailable, DrafterHandleCalls, StreamBackend

MAX_NEW = 12


class FakeHandle:
    """A streaming `DeploymentHandle` stand-in over one in-process Engine or Verifier replica:
    `rounds` streams its `arounds`, each event pickled as Ray sends it. While `deaths` > 0 the
    replica dies after three events (ActorDiedError; the retry meets the same replica, as a
    fresh one would serve it: the request's state there is gone with its closed stream)."""

    def __init__(self, replica: ReplicaDecoder, deaths: int = 0) -> None:
        self.replica, self.deaths, self.calls = replica, deaths, 0

    def options(self, **_: Any) -> FakeHandle:
        return self

    def __getattr__(self, method: str) -> Any:
        handle = self
        assert method == "rounds", method

        class Method:
            def remote(self, *args: Any) -> Any:
                handle.calls += 1
                return _stream(handle, handle.replica.arounds(*args), handle.deaths > 0)

        return Method()


async def _stream(handle: FakeHandle, events: Any, dying: bool) -> Any:
    i = 0
    async with contextlib.aclosing(events):
        async for event in events:
            if dying and i == 3:
                handle.deaths -= 1
                raise ActorDiedError()
            i += 1
            yield pickle.loads(pickle.dumps(event))


class _Answer:
    """A `DeploymentResponse` stand-in: the call's value, or its error, at `result()`."""

    def __init__(self, value: Any = None, error: Exception | None = None) -> None:
        self.value, self.error = value, error

    def result(self, timeout_s: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        return pickle.loads(pickle.dumps(self.value))


class FakeDrafter:
    """The Drafter deployment's handle as `DrafterHandleCalls` uses it, over one in-process
    replica: a call runs at once, in the caller's thread. While `deaths` > 0, calls from the
    third on fail with ActorDiedError and the death wipes the replica's sessions (the retry
    meets a fresh replica). `methods`: the calls in order; `spans`: each call's (start, end)."""

    def __init__(self, replica: ReplicaDecoder, deaths: int = 0) -> None:
        self.replica, self.deaths, self.calls = replica, deaths, 0
        self.methods: list[str] = []
        self.spans: list[tuple[float, float]] = []

    def options(self, **_: Any) -> FakeDrafter:
        return self

    def __getattr__(self, method: str) -> Any:
        handle = self

        class Method:
            def remote(self, *args: Any) -> Any:
                return handle.call(method, *args)

        return Method()

    def call(self, method: str, *args: Any) -> _Answer:
        if method == "release":
            self.replica.release(*args)
            return _Answer()
        self.calls += 1
        self.methods.append(method)
        if self.deaths > 0 and self.calls >= 3:
            self.deaths -= 1
            self.replica.sessions = type(self.replica.sessions)(4)
            return _Answer(error=ActorDiedError())
        start = time.perf_counter()
        value = getattr(self.replica, method)(*pickle.loads(pickle.dumps(args)))
        self.spans.append((start, time.perf_counter()))
        return _Answer(value)


@pytest.fixture(scope="module")
def setup(tiny_cfg):
    """Two processes' worth of models, as the split app deploys them (the PEFT-BD adapter switch
    is model-wide): every method's drafter, and a verifier alone; a prompt and its greedy output."""
    from peftbd.models.loading import load_tokenizer
    from peftbd.serving.models import load_serving_models

    drafters, verifier = load_serving_models(tiny_cfg), load_serving_models(tiny_cfg, ("ar",))
    tok = load_tokenizer(tiny_cfg)
    prompt = encode_prompt(tok, [{"role": "user", "content": "Count from 9 to 15."}])
    expected = decode(verifier.model, prompt, None, MAX_NEW, verifier.eos_ids).tokens
    return drafters, verifier, prompt, expected


def split_app(tiny_cfg, setup, drafter_deaths: int = 0, verifier_deaths: int = 0,
              **serving: Any) -> tuple[StreamBackend, FakeDrafter, FakeHandle]:
    """The split app in-process: the Ingress's backend over a Verifier replica that drafts
    through a Drafter replica (`serving` overrides `tiny_cfg.serving`)."""
    drafters, verifier_models, _, _ = setup
    s = dataclasses.replace(tiny_cfg.serving, **serving)
    drafter = FakeDrafter(ReplicaDecoder(drafters, 16), drafter_deaths)
    verifier = ReplicaDecoder(verifier_models, 16, s.max_batch, s.batch_wait_ms,
                              DrafterHandleCalls(drafter, s), s.split_groups, s.draft_ahead)
    handle = FakeHandle(verifier, verifier_deaths)
    return StreamBackend(handle, s, Role.VERIFIER), drafter, handle


def _spec(prompt: list[int], method: str, request_id: str = "r1") -> GenerationSpec:
    return GenerationSpec(request_id=request_id, kind="chat", model="m", method=method,
                          prompt_ids=prompt, max_new_tokens=MAX_NEW, stream=False,
                          include_usage=False)


def _concurrent(backend: Any, specs: list[GenerationSpec]) -> list[list[RoundEvent]]:
    async def one(spec):
        return [e async for e in backend.rounds(spec)]

    async def run():
        return await asyncio.gather(*(one(s) for s in specs))

    return asyncio.run(run())


def _tokens(events: list[RoundEvent]) -> list[int]:
    return [t for e in events for t in e.tokens]


@pytest.mark.parametrize("method", ["peftbd", "fastmtp", "peftbd_head"])
def test_split_rounds_survive_a_lost_drafter(tiny_cfg, setup, method):
    backend, drafter, _ = split_app(tiny_cfg, setup, drafter_deaths=1)
    [events] = _concurrent(backend, [_spec(setup[2], method)])
    assert _tokens(events) == setup[3] and sum(e.resumes for e in events) == 1
    assert drafter.deaths == 0


def test_split_rounds_hand_the_verifier_features_to_the_head_drafter(tiny_cfg, setup, monkeypatch):
    """Each propose carries what the Verifier computed of the head's features since the last:
    the Drafter replica runs no verifier forward at all, and usage counts the bytes."""
    backend, drafter, _ = split_app(tiny_cfg, setup)
    released: list[str] = []
    monkeypatch.setattr(drafter.replica, "release", released.append)  # keep its session
    [events] = _concurrent(backend, [_spec(setup[2], "peftbd_head")])
    assert _tokens(events) == setup[3]
    assert set(drafter.replica.sessions.get(released[0]).state.forwards.calls) == {"draft"}
    # the prompt's features go with the first propose, each verify's with the next one
    assert events[0].feature_bytes == 0 and all(e.feature_bytes > 0 for e in events[1:-1])
    assert events[1].feature_bytes > events[2].feature_bytes


def test_the_colocated_stream_carries_round_events_as_themselves(tiny_cfg, setup):
    """`Engine.rounds` yields `RoundEvent`s and the Ingress gets the same typed events (pickled
    by Ray, no dict in between): the replica's own steps, with only the ingress-side transport
    filled in."""
    models, _, prompt, expected = setup

    async def replica_steps() -> list[RoundEvent]:
        return [e async for e in ReplicaDecoder(models, 4).arounds(prompt, MAX_NEW, "fastmtp")]

    steps = asyncio.run(replica_steps())
    backend = StreamBackend(FakeHandle(ReplicaDecoder(models, 4)), tiny_cfg.serving, Role.ENGINE)
    [events] = _concurrent(backend, [_spec(prompt, "fastmtp")])
    assert all(type(e) is RoundEvent for e in events) and _tokens(events) == expected
    untimed = lambda e: dataclasses.replace(  # noqa: E731
        e, draft_ms=0.0, verify_ms=0.0, sync_ms=0.0, other_ms=0.0, queued_ms=0.0,
        transport_ms=0.0)
    assert [untimed(e) for e in events] == [untimed(e) for e in steps]


def test_colocated_stream_resumes_on_a_new_engine(tiny_cfg, setup):
    models, _, prompt, expected = setup
    engine = FakeHandle(ReplicaDecoder(models, 4), deaths=1)
    [events] = _concurrent(StreamBackend(engine, tiny_cfg.serving, Role.ENGINE),
                           [_spec(prompt, "fastmtp")])
    assert _tokens(events) == expected and sum(e.resumes for e in events) == 1
    assert engine.deaths == 0


@pytest.mark.parametrize("method", ["ar", "peftbd", "peftbd_head"])
def test_a_split_request_resumes_on_a_new_verifier(tiny_cfg, setup, method):
    """The Ingress streams a split request from the Verifier; a Verifier lost after three steps
    is replaced and the request goes on from the tokens already sent (a prefill over them that
    commits nothing; the Drafter rebuilds its session from what the new Verifier ships),
    exactly."""
    backend, _, verifier = split_app(tiny_cfg, setup, verifier_deaths=1)
    [events] = _concurrent(backend, [_spec(setup[2], method)])
    assert _tokens(events) == setup[3] and verifier.calls == 2 and verifier.deaths == 0
    prefills = [e for e in events if e.prefill]
    assert len(prefills) == 2 and prefills[1].tokens == [] and prefills[1].resumes == 1


def test_a_replica_that_keeps_dying_gives_a_clear_error(tiny_cfg, setup):
    backend, _, _ = split_app(tiny_cfg, setup, drafter_deaths=99)
    with pytest.raises(BackendUnavailable, match="Drafter replica .* lost 3 times"):
        _concurrent(backend, [_spec(setup[2], "peftbd")])
    backend, _, _ = split_app(tiny_cfg, setup, verifier_deaths=99)
    with pytest.raises(BackendUnavailable, match="Verifier replica .* lost 3 times"):
        _concurrent(backend, [_spec(setup[2], "peftbd")])


def test_closing_split_rounds_early_releases_both_sessions(tiny_cfg, setup):
    """A client that leaves (or a stop sequence) closes the rounds mid-request: the request
    leaves the Verifier's batch and its Drafter session is released at once, not left for the
    LRU."""
    backend, drafter, verifier = split_app(tiny_cfg, setup)

    async def two_rounds() -> None:
        rounds = backend.rounds(_spec(setup[2], "fastmtp"))
        for _ in range(3):
            await anext(rounds)
        assert len(drafter.replica.sessions) == verifier.replica.streams == 1
        await rounds.aclose()

    asyncio.run(two_rounds())
    deadline = time.monotonic() + 10
    while len(drafter.replica.sessions) and time.monotonic() < deadline:  # the loop's next turn
        time.sleep(0.01)
    assert len(drafter.replica.sessions) == verifier.replica.streams == 0


@pytest.mark.parametrize("method", ["ar", "peftbd", "fastmtp", "peftbd_head"])
def test_concurrent_split_requests_share_batched_calls_and_stay_exact(tiny_cfg, setup, method):
    """8 concurrent requests: the Verifier's step loop batches their rounds (fewer forwards than
    requests x rounds) and drafts each group's in one Drafter call; every output is exactly the
    engine's, and every Drafter session is released at the end."""
    backend, drafter, verifier = split_app(tiny_cfg, setup, batch_wait_ms=50.0)
    results = _concurrent(backend, [_spec(setup[2], method, f"r{i}") for i in range(8)])
    assert all(_tokens(r) == setup[3] for r in results)
    assert sum(e.resumes for r in results for e in r) == 0
    sizes = verifier.replica.batch_sizes
    assert max(sizes) > 1 and max(e.batch_size for r in results for e in r) > 1
    assert sum(sizes.values()) < sum(len(r) - 1 for r in results)
    if method != "ar":
        assert max(drafter.replica.batch_sizes) > 1
    assert len(drafter.replica.sessions) == 0
    _in_process_transport_is_small(results)


def _in_process_transport_is_small(results: list[list[RoundEvent]]) -> None:
    """With no network between them, most of a request's time is its replicas' (waiting for its
    turn in a step loop included, admission too), not transport: the event loop's own delays
    stay near 10% of it on a loaded box, where counting the waits as transport made 30-50%."""
    transport = sum(e.transport_ms for r in results for e in r)
    assert transport < 0.2 * sum(e.replica_ms for r in results for e in r), transport


@pytest.mark.parametrize("method", ["peftbd", "peftbd_head"])
def test_a_drafter_killed_under_concurrent_load_leaves_every_answer_exact(tiny_cfg, setup, method):
    backend, drafter, _ = split_app(tiny_cfg, setup, drafter_deaths=1)
    results = _concurrent(backend, [_spec(setup[2], method, f"r{i}") for i in range(6)])
    assert all(_tokens(r) == setup[3] for r in results)
    assert sum(e.resumes for r in results for e in r) >= 1 and drafter.deaths == 0


def test_an_engine_killed_under_concurrent_load_leaves_every_answer_exact(tiny_cfg, setup):
    models, _, prompt, expected = setup
    replica = ReplicaDecoder(models, 16)
    results = _concurrent(StreamBackend(FakeHandle(replica, deaths=1), tiny_cfg.serving, Role.ENGINE),
                          [_spec(prompt, "fastmtp", f"r{i}") for i in range(6)])
    assert all(_tokens(r) == expected for r in results)
    assert sum(e.resumes for r in results for e in r) >= 1 and max(replica.batch_sizes) > 1
    _in_process_transport_is_small(results)


class SpanLock(BusyLock):
    """A `BusyLock` that records each time it was held: (start, end)."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[tuple[float, float]] = []

    def __exit__(self, *exc: object) -> None:
        self.spans.append((self._since, time.perf_counter()))
        super().__exit__(*exc)


def _overlap_s(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


@pytest.mark.parametrize("groups", [1, 2])
def test_split_groups_overlap_drafting_with_verifying_and_stay_exact(tiny_cfg, setup, groups):
    """Two groups: the Drafter drafts one while the Verifier verifies the other (the Verifier's
    model lock is free while a group waits for its drafts, and the other group's forwards take
    it); one group is lockstep (a draft and a verify never overlap). Either way every output is
    the engine's."""
    backend, drafter, verifier = split_app(tiny_cfg, setup, split_groups=groups, batch_wait_ms=50.0)
    lock = verifier.replica.lock = verifier.replica.loop.lock = SpanLock()
    results = _concurrent(backend, [_spec(setup[2], "peftbd", f"r{i}") for i in range(8)])
    assert all(_tokens(r) == setup[3] for r in results)
    overlap = _overlap_s(drafter.spans, lock.spans)
    busy = sum(e - s for s, e in drafter.spans)
    if groups == 1:
        assert overlap < 0.05 * busy
    else:
        assert overlap > 0.2 * busy
        assert max(verifier.replica.batch_sizes) <= 4  # a group: half the requests
