"""A split Verifier's drafter: the engine's scheduler runs every round there, and its propose is a
call to the Drafter deployment (`DrafterCalls`: a transport the serve app wires over a handle).

`RemoteDrafter` is a `peftbd.decoding.drafter.Drafter` whose `propose` sends one typed item per
request (`ProposeItem`: the committed tokens and what the verifier computed since the drafter's
last call of what that drafter reads: the head's features, FastMTP's final hidden states or
PEFT-BD's KV, `peftbd.serving.features`) and returns the drafts. The Drafter replica catches its
session up with what was shipped, else rebuilds it from the committed tokens, so a lost Drafter
replica costs a re-prefill there, never a different output. While it waits for the reply the
replica's model lock is released (`wait`), so another group's verify runs on the Verifier
meanwhile (PEARL-style overlap across requests: `peftbd.serving.batcher`).

Drafting ahead (`serving.draft_ahead`, `peftbd.decoding.ahead`): after a propose, while `may_ahead()`
(no other group would keep the Drafter busy), it asks the Drafter for each request's next round
for the likeliest accepted length of the round about to verify, without waiting; the next propose
of a request whose verify accepted exactly that many takes the pre-draft instead of a call, and
ships what the skipped call would have carried with the call after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ContextManager, Protocol

import torch

from peftbd.decoding.ahead import likeliest
from peftbd.decoding.state import DecodeState, present
from peftbd.serving.features import FINAL_HIDDEN, FeatureBlock, KVBlock, Shipped, feature_bytes, joined
from peftbd.serving.messages import AheadItem, AheadReply, ProposeItem, ProposeReply


class DrafterCalls(Protocol):
    """The Drafter deployment as the Verifier calls it (blocking calls from its step loop)."""

    def propose(self, items: Sequence[ProposeItem]) -> list[ProposeReply]:
        """One batched propose; replies in item order."""

    def ahead(self, items: Sequence[AheadItem]) -> Callable[[], list[AheadReply]]:
        """Start one batched pre-draft; returns what waits for its replies."""

    def release(self, session_id: str) -> None:
        """Forget a request's session on the Drafter (fire and forget)."""


@dataclass(frozen=True)
class RemoteRound:
    """A request's last propose as the Drafter answered it: its times, whether the Drafter had to
    rebuild the session, the bytes of verifier state it carried, and whether it was drafted
    ahead. `call_ms`: the call's wall time here (its transport is that minus `handler_ms`)."""

    draft_ms: float = 0.0
    sync_ms: float = 0.0
    handler_ms: float = 0.0
    call_ms: float = 0.0
    resumed: bool = False
    feature_bytes: int = 0
    pre_drafted: bool = False


@dataclass
class Remote:
    """A request's `state.drafter_state` on a split Verifier: its session id on the Drafter, what
    the verifier cached that the Drafter has not taken (`pending`), a pre-draft in flight
    (`ahead`: what waits for it, the tokens it continues, its row) and its `last` round."""

    session_id: str
    pending: Shipped = None
    ahead: tuple[Callable[[], list[AheadReply]], list[int], int] | None = None
    last: RemoteRound = dataclasses.field(default_factory=RemoteRound)


class RemoteDrafter:
    """Proposes through `calls` for requests of `method` (see module doc). `ships`: what the
    method's drafter reads of the verifier (`Method.ships`: "features", "hidden", "kv") when
    the verifier sends it, else None; `feature_layers`: the verifier layers to keep for it;
    `wait()`: a context during which the replica's model lock is free."""

    reads_kv_layers: int | None = 0
    reads_hidden = False

    def __init__(self, method: str, calls: DrafterCalls, ships: str | None,
                 feature_layers: Sequence[int] = (), draft_ahead: bool = False,
                 may_ahead: Callable[[], bool] = lambda: True,
                 wait: Callable[[], ContextManager[object]] = contextlib.nullcontext) -> None:
        self.method, self.calls, self.ships = method, calls, ships
        self.feature_layers = tuple(feature_layers)
        self.draft_ahead, self.may_ahead, self.wait = draft_ahead, may_ahead, wait

    @property
    def name(self) -> str:
        return f"remote:{self.method}"

    def start(self, state: DecodeState) -> None:
        state.drafter_state = Remote(uuid.uuid4().hex)

    def release(self, state: DecodeState) -> None:
        """The request is over: its Drafter session goes."""
        if isinstance(state.drafter_state, Remote):
            self.calls.release(state.drafter_state.session_id)

    def propose(self, states: Sequence[DecodeState], max_tokens: Sequence[int]) -> list[torch.Tensor]:
        remotes = [_remote(s) for s in states]
        for state, remote in zip(states, remotes):  # what the last prefill / verify cached
            remote.pending = joined(remote.pending, self._shipped(state))
        drafts: dict[int, list[int]] = {}
        for i, (state, remote) in enumerate(zip(states, remotes)):
            pre = self._pre_drafted(state, remote)
            if pre is not None:
                drafts[i] = pre.draft[: max_tokens[i]]
                remote.last = RemoteRound(draft_ms=pre.draft_ms, handler_ms=pre.handler_ms,
                                          pre_drafted=True)
        calling = [i for i in range(len(states)) if i not in drafts]
        if calling:
            items = [ProposeItem(remotes[i].session_id, list(states[i].tokens), states[i].prompt_len,
                                 states[i].max_new_tokens, self.method, remotes[i].pending,
                                 states[i].sampling) for i in calling]
            with self.wait():  # (taking the lock back after it is no part of the call)
                start = time.perf_counter()
                replies = self.calls.propose(items)
                call_ms = (time.perf_counter() - start) * 1e3
            for i, item, reply in zip(calling, items, replies):
                drafts[i] = reply.draft
                remotes[i].pending = None
                remotes[i].last = RemoteRound(reply.draft_ms, reply.sync_ms, reply.handler_ms,
                                              call_ms, reply.resumed, feature_bytes(item.shipped))
        self._ahead(states, [drafts[i] for i in range(len(states))])
        return [torch.tensor([drafts[i]], dtype=torch.long, device=s.device)
                for i, s in enumerate(states)]

    def _ahead(self, states: Sequence[DecodeState], drafts: Sequence[list[int]]) -> None:
        """With `draft_ahead`, start each request's pre-draft for the likeliest accepted length of
        the round about to verify (no wait; its next propose takes it if the guess holds). A
        request whose draft was itself drafted ahead sends what its Drafter session has not
        taken yet with it, so the session reaches the committed tokens without a forward."""
        if not self.draft_ahead or not self.may_ahead():
            return
        rows = [i for i, d in enumerate(drafts) if d]
        if not rows:
            return
        guesses = {i: likeliest([r.accepted for r in states[i].rounds], len(drafts[i])) for i in rows}
        items = []
        for i in rows:
            remote = _remote(states[i])
            items.append(AheadItem(remote.session_id, list(states[i].tokens), self.method,
                                   drafts[i], guesses[i], remote.pending))
            remote.pending = None  # the pre-draft's catch-up takes it (lost: a forward there)
        waiting = functools.cache(self.calls.ahead(items))  # one wait for all its rows
        for n, i in enumerate(rows):
            _remote(states[i]).ahead = (waiting, list(states[i].tokens) + drafts[i][: guesses[i]], n)

    def _pre_drafted(self, state: DecodeState, remote: Remote) -> AheadReply | None:
        """The request's pre-draft when the round that verified since accepted exactly the
        guessed tokens (its committed tokens continue the pre-draft's by one bonus token), else
        None; a lost or empty pre-draft costs the ordinary propose, nothing else. Its reply is
        awaited either way (the Drafter answers calls in turn: the next propose would wait
        behind it there), and a Drafter that answers it cannot draft ahead for this method is
        not asked again."""
        if remote.ahead is None:
            return None
        waiting, continued, row = remote.ahead
        remote.ahead = None
        try:
            with self.wait():
                got = waiting()[row]
        except Exception:
            return None
        self.draft_ahead &= got.drafts_ahead
        if len(state.tokens) != len(continued) + 1 or state.tokens[: len(continued)] != continued:
            return None
        return got if got.draft else None

    def _shipped(self, state: DecodeState) -> Shipped:
        """What the drafter reads of the positions the last forward added to `state.cache`: the
        head's features, the final hidden states or every layer's KV (None when it is sent
        nothing, or the request is done)."""
        if self.ships is None or state.done:
            return None
        if self.ships == "features":
            features = present(state.features, "state.features")
            start = state.cache.get_seq_length() - features.shape[1]
            return FeatureBlock.encode(features, state.feature_layers, start)
        hidden = present(state.hidden, "state.hidden")
        start = state.cache.get_seq_length() - hidden.shape[1]
        if self.ships == "hidden":
            return FeatureBlock.encode(hidden, FINAL_HIDDEN, start)
        return KVBlock.encode([(k[:, :, start:], v[:, :, start:]) for k, v in state.cache.committed()],
                              start)


def _remote(state: DecodeState) -> Remote:
    remote = state.drafter_state
    if not isinstance(remote, Remote):
        raise TypeError("a RemoteDrafter proposes only for states it started (`start`)")
    return remote
