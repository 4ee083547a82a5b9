"""The compute behind every serving replica, as plain-data calls (typed items in, typed replies
out: `peftbd.serving.messages`).

- colocated Engine and split Verifier: `rounds` / `arounds` stream one request's steps (prefill,
  then rounds) from the replica's step loop (`peftbd.serving.batcher.StepLoop`: the engine's
  scheduler), which decodes the concurrent requests of each method as one batch. On a split
  Verifier (`drafters` given) each method's drafter is a `RemoteDrafter`: its propose is a
  batched call to the Drafter deployment carrying what the verifier computed that the method's
  drafter reads (`peftbd.serving.features`: the head's features, FastMTP's final hidden states,
  PEFT-BD's KV; `serving.drafter_sync`);
- split Drafter: `propose_batch` (and `ahead_batch`, drafting ahead) over a list of per-request
  items: the items of one method share one batched catch-up and one batched draft. Each item
  carries the committed tokens, and a request's session is reused only when it agrees with them
  (else rebuilt: a `resume`, batched too); it takes what the verifier shipped instead of running
  the verifier itself.

One lock serializes model work: the PEFT-BD adapter switch is model-wide, so two batched calls
(or a call and the step loop) must never run forwards at the same time in one replica. Times
come from the engine's clock; every item of a batched call reports the whole call's times.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import queue
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from peftbd.decoding import DecodeState, SpeculativeDecoder, advance_rows, advance_shipped
from peftbd.decoding.ahead import drafts_ahead
from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.methods import by_serving
from peftbd.serving.batcher import StepLoop, Ticket
from peftbd.serving.busy_lock import BusyLock
from peftbd.serving.features import FINAL_HIDDEN, FeatureBlock, KVBlock, Shipped
from peftbd.serving.messages import (
    AheadItem,
    AheadReply,
    ProposeItem,
    ProposeReply,
    ReplicaStats,
    Reply,
)
from peftbd.serving.models import ServingModels
from peftbd.serving.remote_drafter import DrafterCalls
from peftbd.serving.rounds import RoundEvent
from peftbd.serving.sessions import Session, SessionStore, from_shipped, resume_many, taken


class ReplicaDecoder:
    """A replica's models plus its per-request sessions, step loop and counters."""

    def __init__(self, models: ServingModels, max_sessions: int, max_batch: int = 16,
                 batch_wait_ms: float = 2.0, drafters: DrafterCalls | None = None,
                 groups: int = 1, draft_ahead: bool = False) -> None:
        """`drafters`: a split Verifier's calls to its Drafter deployment (its step loop's
        `groups` and `draft_ahead`: `serving.split_groups`, `serving.draft_ahead`)."""
        self.models = models
        self.sessions = SessionStore(max_sessions)
        self.lock = BusyLock()
        self.counters = {"prefills": 0, "resumes": 0, "rounds": 0}
        self.batch_sizes: collections.Counter = collections.Counter()
        """Rows of each batched step (Engine, Verifier) or call (Drafter): `batch_sizes[n]` = how many."""
        self._drafters, self._draft_ahead = drafters, draft_ahead
        self._remote: dict[str, SpeculativeDecoder] = {}
        self.loop = StepLoop(models.decoder if drafters is None else self._remote_decoder,
                             max_batch, batch_wait_ms, self.lock, self.counters, self.batch_sizes,
                             groups)

    def _remote_decoder(self, method: str) -> SpeculativeDecoder:
        """A split Verifier's decoder of `method` (built once): its drafter proposes through the
        Drafter deployment, drafting ahead only while one group has requests."""
        if method not in self._remote:
            assert self._drafters is not None
            self._remote[method] = self.models.remote_decoder(
                method, self._drafters, self._draft_ahead, lambda: self.loop.solo,
                self.lock.released)
        return self._remote[method]

    @property
    def streams(self) -> int:
        """Requests streaming now (their state lives in the step loop until closed)."""
        return self.loop.open

    def stats(self, replica_id: str) -> ReplicaStats:
        """This replica's counters as the typed reply of a deployment's `stats()`."""
        c = self.counters
        return ReplicaStats(replica=replica_id, sessions=len(self.sessions), streams=self.streams,
                            busy_s=self.lock.busy_s, batch_sizes=dict(self.batch_sizes),
                            prefills=c["prefills"], resumes=c["resumes"], rounds=c["rounds"])

    # colocated Engine, split Verifier ------------------------------------------------------

    def rounds(self, prompt_ids: Sequence[int], max_new_tokens: int, method: str,
               committed: Sequence[int] = (), sampling: SamplingParams = GREEDY
               ) -> Iterator[RoundEvent]:
        """One request's steps from the step loop. `committed` (prompt + tokens already sent)
        resumes a request whose replica died: its first event then commits nothing. Closing
        the generator early (client gone, stop sequence) takes the request out of its batch."""
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        ticket = self._ticket(prompt_ids, max_new_tokens, method, committed, inbox.put, sampling)
        try:
            while True:
                event = _event(inbox.get())
                yield event
                if event.done:
                    return
        finally:
            self.loop.close(ticket)

    async def arounds(self, prompt_ids: Sequence[int], max_new_tokens: int, method: str,
                      committed: Sequence[int] = (), sampling: SamplingParams = GREEDY
                      ) -> AsyncIterator[RoundEvent]:
        """`rounds` for an asyncio caller (a Serve replica): waiting never blocks its loop."""
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[RoundEvent | BaseException] = asyncio.Queue()
        ticket = self._ticket(prompt_ids, max_new_tokens, method, committed,
                              lambda item: loop.call_soon_threadsafe(inbox.put_nowait, item),
                              sampling)
        try:
            while True:
                event = _event(await inbox.get())
                yield event
                if event.done:
                    return
        finally:
            self.loop.close(ticket)

    def _ticket(self, prompt_ids: Sequence[int], max_new_tokens: int, method: str,
                committed: Sequence[int], deliver, sampling: SamplingParams) -> Ticket:
        committed = list(committed) if len(committed) > len(prompt_ids) else list(prompt_ids)
        return self.loop.submit(Ticket(list(prompt_ids), max_new_tokens, method, committed,
                                       deliver, sampling.resolved()))

    # split Drafter -------------------------------------------------------------------------

    def propose_batch(self, items: Sequence[ProposeItem]) -> list[ProposeReply]:
        """Catch each request up with its `committed` (taking what the verifier shipped, or one
        batched adapter-off forward per method, `advance_rows`), then one batched draft per
        method."""
        clock = self.models.clock
        start = clock.now()
        replies: dict[int, ProposeReply] = {}
        with self.lock:
            for method, idx in _by([it.method for it in items]).items():
                dec, group = self.models.decoder(method), [items[i] for i in idx]
                for it in group:
                    _check_layers(dec, it.shipped, method)
                sync_start = clock.now()
                sessions, resumed = self._catch_up(dec, group)
                draft_start = clock.now()
                drafts = dec.propose_many([s.state for s in sessions])
                end = clock.now()
                for i, sess, draft, r in zip(idx, sessions, drafts, resumed):
                    sess.proposed_at = len(sess.state.tokens)
                    replies[i] = ProposeReply(draft[0].tolist(), (end - draft_start) * 1e3,
                                              (draft_start - sync_start) * 1e3, r)
            self.batch_sizes[len(items)] += 1
        return _stamp(replies, len(items), (clock.now() - start) * 1e3)

    def ahead_batch(self, items: Sequence[AheadItem]) -> list[AheadReply]:
        """Draft each request's next round ahead, while its current round verifies elsewhere
        (`peftbd.decoding.ahead`: a batched pre-draft per method), from its session caught up
        with `committed` by what the verifier shipped; the guessed tokens never enter it. An
        item whose session cannot get there without a forward gets no pre-draft: never a
        forward or a rebuild for a guess."""
        clock = self.models.clock
        start = clock.now()
        replies: dict[int, AheadReply] = {i: AheadReply([], 0.0) for i in range(len(items))}
        with self.lock:
            for method, idx in _by([it.method for it in items]).items():
                dec = self.models.decoder(method)
                if not drafts_ahead(dec.drafter):
                    replies.update({i: AheadReply([], 0.0, drafts_ahead=False) for i in idx})
                    continue
                ready = [(i, s) for i in idx if (s := self._caught_up(dec, items[i])) is not None]
                if not ready:
                    continue
                states = [s.state for _, s in ready]
                draft_start = clock.now()
                pre = dec.drafter.propose_ahead(  # type: ignore[attr-defined]
                    states, [items[i].draft for i, _ in ready], [items[i].accepted for i, _ in ready],
                    [s.remaining - items[i].accepted - 2 for (i, _), s in zip(ready, states)])
                draft_ms = (clock.now() - draft_start) * 1e3
                for (i, _), p in zip(ready, pre):
                    replies[i] = AheadReply(p.draft[0].tolist(), draft_ms)
            self.batch_sizes[len(items)] += 1
        return _stamp(replies, len(items), (clock.now() - start) * 1e3)

    def _caught_up(self, dec: SpeculativeDecoder, item: AheadItem) -> Session | None:
        """`item`'s session at its `committed`, taking what the verifier shipped (no forward),
        or None when it cannot get there so."""
        sess = self.sessions.get(item.session_id)
        if sess is None or sess.cache_behind or not _prefix(sess, item.committed):
            return None
        if len(sess.state.tokens) < len(item.committed) and not _took_shipped(dec, sess, item):
            return None
        return sess

    def _catch_up(self, dec: SpeculativeDecoder,
                  items: Sequence[ProposeItem]) -> tuple[list[Session], list[bool]]:
        """Each item's session brought up to its `committed`: with what the verifier shipped for
        exactly the positions cached since its last round (no forward), else by one batched
        forward, else (a new, lost or stale session, or one whose verifier cache fell behind)
        rebuilt: from the prefill's features without a forward, or by one batched
        `resume_many`. Also whether each was a rebuild past the first round."""
        sessions: dict[int, Session] = {}
        behind, rebuild = [], []
        for i, it in enumerate(items):
            sess = self.sessions.get(it.session_id)
            if sess is None or not _extends(sess, it.committed):
                rebuild.append(i)
                continue
            sessions[i] = sess
            if len(sess.state.tokens) == len(it.committed) or _took_shipped(dec, sess, it):
                continue
            if sess.cache_behind:
                rebuild.append(i)
            else:
                behind.append(i)
        if behind:  # early exit syncs only its k layers
            advance_rows(dec.model, [sessions[i].state for i in behind],
                         [items[i].committed[len(sessions[i].state.tokens):] for i in behind],
                         drafter=dec.drafter)
        prefilled: dict[int, FeatureBlock | KVBlock] = {}
        for i in rebuild:  # the prefill's shipped state of every cached position: no forward
            block = items[i].shipped
            if block is not None and block.covers(0, len(items[i].committed) - 1):
                prefilled[i] = block
        for i, block in prefilled.items():
            it = items[i]
            sessions[i] = Session(
                from_shipped(dec, it.committed, it.prompt_len, it.max_new_tokens, block, it.sampling),
                cache_behind=not isinstance(block, KVBlock))
        resumed = [i for i in rebuild if i not in prefilled]
        for i, state in zip(resumed, self._resume(dec, [items[i] for i in resumed])):
            sessions[i] = Session(state)
        again = [False] * len(items)
        for i in rebuild:  # a new session (its first round), or a lost / stale one
            it = items[i]
            again[i] = len(it.committed) > it.prompt_len + 1
            self._count_rebuild(fresh=not again[i])
            self.sessions.put(it.session_id, sessions[i])
        return [sessions[i] for i in range(len(items))], again

    def _resume(self, dec: SpeculativeDecoder, items: Sequence[ProposeItem]
                ) -> list[DecodeState]:
        if not items:
            return []
        return resume_many(dec, [it.committed for it in items], [it.prompt_len for it in items],
                           [it.max_new_tokens for it in items], [it.sampling for it in items])

    def release(self, session_id: str) -> None:
        """Forget a finished or abandoned session."""
        with self.lock:
            self.sessions.drop(session_id)

    def _count_rebuild(self, fresh: bool) -> None:
        self.counters["prefills" if fresh else "resumes"] += 1


def _event(item: RoundEvent | BaseException) -> RoundEvent:
    if isinstance(item, BaseException):
        raise item
    return item


def _stamp(replies: dict[int, Reply], n: int, handler_ms: float) -> list[Reply]:
    """The replies to items 0 .. n-1 in order, each with the whole batched call's handler time
    and size."""
    return [dataclasses.replace(replies[i], handler_ms=handler_ms, batch_size=n) for i in range(n)]


def _check_layers(dec: SpeculativeDecoder, block: Shipped, method: str) -> None:
    if isinstance(block, FeatureBlock) and block.layers != FINAL_HIDDEN \
            and block.layers != dec.drafter.feature_layers:
        m = by_serving(method)
        raise ValueError(
            f"the Verifier sent features of verifier layers {list(block.layers)} but this "
            f"Drafter's {dec.drafter.name} reads {list(dec.drafter.feature_layers)}: deploy both "
            f"with the same {m.dir_arg} (or, untrained, the same `{m.section}` config)"
        )


def _by(keys: Sequence[Any]) -> dict[Any, list[int]]:
    """Indices of `keys` grouped by key, in first-seen order."""
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return groups


def _prefix(sess: Session, committed: Sequence[int]) -> bool:
    """The session's tokens are a prefix of `committed`."""
    n = len(sess.state.tokens)
    return n <= len(committed) and list(committed[:n]) == sess.state.tokens


def _extends(sess: Session, committed: Sequence[int]) -> bool:
    """The session's tokens are a prefix of `committed` and it has not drafted from exactly
    `committed` yet (the MTP drafter consumes each verify's hidden states once)."""
    n = len(sess.state.tokens)
    return _prefix(sess, committed) and (n < len(committed) or sess.proposed_at != n)


def _took_shipped(dec: SpeculativeDecoder, sess: Session, item: ProposeItem | AheadItem) -> bool:
    """Whether `sess` (a prefix of `item.committed`) caught up with what the verifier shipped,
    which holds exactly the positions it lacks (no forward); else it is left as it was."""
    state, block = sess.state, item.shipped
    if block is None or not block.covers(len(state.tokens) - 1, len(item.committed) - 1):
        return False
    advance_shipped(state, item.committed[len(state.tokens):],
                    **taken(block, state.device, dec.drafter.reads_kv_layers))
    sess.cache_behind |= not isinstance(block, KVBlock)
    return True
