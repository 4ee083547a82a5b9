"""Drafting ahead on a split Verifier, over in-process replicas (the handles of
`test_serve_backends`): a confirmed guess skips the propose and the output stays exact, methods
that cannot draft ahead are asked once, and only a Drafter that would idle drafts ahead."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from peftbd.decoding.state import DecodeState
from peftbd.serving.messages import AheadReply, ProposeReply
from peftbd.serving.remote_drafter import RemoteDrafter
from tests.serve_apps.test_serve_backends import (  # noqa: F401 (setup: a fixture)
    _concurrent,
    _spec,
    _tokens,
    setup,
    split_app,
)


def test_a_confirmed_guess_skips_the_propose_and_the_output_stays_exact(tiny_cfg, setup,
                                                                       monkeypatch):
    """One client, PEFT-BD at controlled acceptance (its accepted lengths vary, so some guesses
    miss): the idle Drafter drafts each next round during the verify; a round whose guess held
    runs without a propose, the Drafter catches up from the shipped KV only (no forward, no
    rebuild), and the output is AR's."""
    import peftbd.serving.replica as replica

    forwards: list[int] = []  # the Drafter's catch-up forwards
    monkeypatch.setattr(replica, "advance_rows", lambda *a, **k: forwards.append(1))
    from peftbd.serving.models import load_serving_models

    cfg = dataclasses.replace(tiny_cfg, serving=dataclasses.replace(
        tiny_cfg.serving, synthetic=("peftbd=2.881",)))
    drafters = load_serving_models(cfg)
    backend, drafter, _ = split_app(cfg, (drafters, *setup[1:]), draft_ahead=True, split_groups=1)
    [events] = _concurrent(backend, [_spec(setup[2], "peftbd")])
    assert _tokens(events) == setup[3]
    rounds, used = events[1:], [e for e in events if e.pre_drafted]
    assert used and len(used) < len(rounds)
    assert drafter.methods.count("propose_batch") == len(rounds) - len(used)
    assert drafter.methods.count("ahead_batch") >= len(used)
    assert drafter.replica.counters["resumes"] == 0 and not forwards
    assert len(drafter.replica.sessions) == 0


@pytest.mark.parametrize("method", ["peftbd", "fastmtp"])
def test_concurrent_requests_drafting_ahead_stay_exact(tiny_cfg, setup, method):
    """Eight requests with drafting ahead on (real acceptance): exact outputs; a method whose
    drafter cannot draft ahead (FastMTP) is asked once, then never again."""
    backend, drafter, _ = split_app(tiny_cfg, setup, draft_ahead=True, split_groups=1,
                                    batch_wait_ms=50.0)
    results = _concurrent(backend, [_spec(setup[2], method, f"r{i}") for i in range(8)])
    assert all(_tokens(r) == setup[3] for r in results)
    asked = drafter.methods.count("ahead_batch")
    if method == "fastmtp":
        assert asked == 1 and not any(e.pre_drafted for r in results for e in r)
    else:
        assert asked > 2


class _Calls:
    """`DrafterCalls` that draft [7, 8] and pre-draft [2], counting the pre-drafts asked."""

    def __init__(self) -> None:
        self.asked = 0

    def propose(self, items):
        return [ProposeReply([7, 8], 1.0, 0.0, False) for _ in items]

    def ahead(self, items):
        self.asked += 1
        return lambda: [AheadReply([2], 1.0) for _ in items]

    def release(self, session_id):
        pass


def _state() -> DecodeState:
    """A request's state as far as a remote drafter that ships nothing reads it."""
    return DecodeState([1, 2, 3], 2, 8, frozenset(), None, None, torch.device("cpu"))  # type: ignore[arg-type]


def test_drafting_ahead_only_takes_a_drafter_that_would_idle():
    """No pre-draft while another group of the Verifier has requests (`may_ahead` false: their
    proposes would wait behind it) or with drafting ahead off; one when the Drafter would idle."""
    def asked(draft_ahead: bool, idle: bool) -> int:
        calls = _Calls()
        drafter = RemoteDrafter("peftbd", calls, None, draft_ahead=draft_ahead,
                                may_ahead=lambda: idle)
        state = _state()
        drafter.start(state)
        assert drafter.propose([state], [7])[0].tolist() == [[7, 8]]
        return calls.asked

    assert asked(True, idle=True) == 1
    assert asked(True, idle=False) == asked(False, idle=True) == 0


def test_a_pre_draft_is_taken_only_when_its_guess_held():
    """The next round takes the pre-draft when the verify accepted the guessed tokens (none yet:
    the guess is 0, so the committed tokens grew by the bonus alone), else it proposes."""
    for bonus_only, expected in ((True, [2]), (False, [7, 8])):
        calls = _Calls()
        drafter = RemoteDrafter("peftbd", calls, None, draft_ahead=True)
        state = _state()
        drafter.start(state)
        drafter.propose([state], [7])
        state.tokens += [9] if bonus_only else [7, 9]
        assert drafter.propose([state], [7])[0].tolist() == [expected]
        assert state.drafter_state.last.pre_drafted == bonus_only
        assert isinstance(drafter.propose([state], [7])[0], torch.Tensor)
