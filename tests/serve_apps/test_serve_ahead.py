"""Drafting ahead in the split round driver, over in-process replicas (the handles of
`test_serve_backends`): a confirmed guess skips the propose and the output stays exact, methods
that cannot draft ahead are asked once, and only a Drafter that would idle drafts ahead."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from peftbd.serving.replica import ReplicaDecoder
from serve_apps.backends import split_driver
from tests.serve_apps.test_serve_backends import (  # noqa: F401 (setup: a fixture)
    ThreadedHandle,
    _concurrent,
    _spec,
    setup,
)


@pytest.fixture(scope="module")
def ahead_apps(tiny_cfg):
    """A split app's two processes' worth of models drafting ahead, PEFT-BD at controlled
    acceptance (its accepted lengths vary, so some guesses miss)."""
    from peftbd.serving.models import load_serving_models

    serving = dataclasses.replace(tiny_cfg.serving, synthetic=("peftbd=2.881",), draft_ahead=True,
                                  split_groups=1)
    cfg = dataclasses.replace(tiny_cfg, serving=serving)
    return cfg, load_serving_models(cfg), load_serving_models(cfg)


class CountingHandle(ThreadedHandle):
    """A `ThreadedHandle` that also records the methods called, in order."""

    def __init__(self, replica: ReplicaDecoder) -> None:
        super().__init__(replica)
        self.methods: list[str] = []

    def timed(self, method: str, *args: Any) -> Any:
        self.methods.append(method)
        return super().timed(method, *args)


def test_a_confirmed_guess_skips_the_propose_and_the_output_stays_exact(setup, ahead_apps,
                                                                       monkeypatch):
    """One client: the idle Drafter drafts each next round during the verify; a round whose
    guess held runs without a propose, the Drafter catches up from the shipped KV only (no
    forward, no rebuild), and the output is AR's."""
    _, prompt, expected = setup
    cfg, drafter_models, verifier_models = ahead_apps
    import peftbd.serving.replica as replica

    forwards: list[int] = []  # the Drafter's catch-up forwards
    monkeypatch.setattr(replica, "advance_rows", lambda *a, **k: forwards.append(1))
    drafter = CountingHandle(ReplicaDecoder(drafter_models, 16))
    verifier = ThreadedHandle(ReplicaDecoder(verifier_models, 16))
    [events] = _concurrent(split_driver(drafter, verifier, cfg.serving), [_spec(prompt, "peftbd")])
    assert [t for e in events for t in e.tokens] == expected
    rounds, used = events[1:], [e for e in events if e.pre_drafted]
    assert used and len(used) < len(rounds)
    assert drafter.methods.count("propose_batch") == len(rounds) - len(used)
    assert drafter.methods.count("ahead_batch") >= len(used)
    assert drafter.replica.counters["resumes"] == 0 and not forwards
    assert len(drafter.replica.sessions) == len(verifier.replica.sessions) == 0


@pytest.mark.parametrize("method", ["peftbd", "fastmtp"])
def test_concurrent_requests_drafting_ahead_stay_exact(tiny_cfg, setup, method):
    """Eight requests with drafting ahead on (real acceptance): exact outputs; a method whose
    drafter cannot draft ahead (FastMTP) is asked once, then never again."""
    _, prompt, expected = setup
    from peftbd.serving.models import load_serving_models

    serving = dataclasses.replace(tiny_cfg.serving, draft_ahead=True, split_groups=1)
    drafter = CountingHandle(ReplicaDecoder(load_serving_models(tiny_cfg), 16))
    verifier = ThreadedHandle(ReplicaDecoder(setup[0], 16))
    driver = split_driver(drafter, verifier, serving)
    results = _concurrent(driver, [_spec(prompt, method, f"r{i}") for i in range(8)])
    assert all([t for e in r for t in e.tokens] == expected for r in results)
    asked = drafter.methods.count("ahead_batch")
    if method == "fastmtp":
        assert driver._no_ahead == {"fastmtp"} and asked <= 2
        assert not any(e.pre_drafted for r in results for e in r)
    else:
        assert not driver._no_ahead and asked > 2


def test_drafting_ahead_only_takes_a_drafter_that_would_idle(tiny_cfg, setup):
    """No pre-draft while another group has requests (its propose would wait behind it) or this
    group's propose is under way; one when the Drafter would idle."""
    from peftbd.serving.messages import AheadReply
    from peftbd.serving.round_driver import Course, RoundDriver

    async def send(kind: str, items: list) -> list:
        return [(AheadReply([2], 0.0), 0.0) for _ in items]

    serving = dataclasses.replace(tiny_cfg.serving, draft_ahead=True, split_groups=2)
    spec = _spec(setup[1], "peftbd")

    async def run() -> list:
        driver = RoundDriver(send, lambda role, sid: None, serving)
        mine, other = (Course(driver._where, driver._changed, g) for g in (0, 1))
        mine.move(("to", "verify"))
        other.move(("in", "verify"))
        busy = driver._ahead(spec, [5, 6], [7, 8], [], mine, None)
        other.move(None)
        free = driver._ahead(spec, [5, 6], [7, 8], [], mine, None)
        off = RoundDriver(send, lambda role, sid: None,
                          dataclasses.replace(serving, draft_ahead=False))
        return [busy, free and await free[0], off._ahead(spec, [5, 6], [7, 8], [], mine, None)]

    busy, free, off = asyncio.run(run())
    assert busy is None and off is None and free[0].draft == [2]
