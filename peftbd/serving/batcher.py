"""A model replica's step loop: the concurrent requests of one replica decoded together by the
engine's scheduler (`peftbd.decoding.scheduler.Scheduler`, the one the benchmark runs: continuous
batching, chunked packed prefill, resumes). The colocated Engine runs it with each method's
drafter; a split Verifier runs it with each method's `RemoteDrafter`, whose propose is a call to
the Drafter deployment (`peftbd.serving.remote_drafter`).

Requests `submit` themselves and get their `RoundEvent`s through their own `deliver` callback
(a queue per request). Requests are dealt round-robin into `groups` (the decisions of this loop are
`peftbd.serving.step_policy`'s, which the placement simulator shares), each stepped by a thread of
its own: hand its waiting requests to their method's scheduler (an idle group first waits up to
`batch_wait_ms` for a batch that is not full), then step one method's scheduler (admit up to
`max_batch`, one prefill chunk, one round of the prefilled), deliver each request's event of that
step, and cancel the requests whose consumer closed them. Every step holds the replica's model
lock, except while a remote drafter waits for its Drafter: with two groups on a split Verifier,
one group verifies while the other's drafts are made elsewhere (PEARL-style overlap across
requests); one group is the lockstep of all. Requests of different methods never share a
forward (the PEFT-BD adapter switch is model-wide): each method has its own scheduler per group
and a group alternates between them, step by step.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from peftbd.decoding import DecodeState, SpeculativeDecoder
from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.decoding.scheduler import Scheduler, Stepped
from peftbd.serving.busy_lock import BusyLock
from peftbd.serving.remote_drafter import Remote
from peftbd.serving.step_policy import Group, deal, solo
from peftbd.serving.rounds import RoundEvent
from peftbd.serving.schemas import FinishReason

Deliver = Callable[[RoundEvent | BaseException], None]
"""Hands one step (or the error that ended the request) to the request's consumer."""


@dataclass(eq=False)
class Ticket:
    """One request in the loop. `committed` longer than the prompt resumes a request whose
    replica died (its first event then commits nothing)."""

    prompt_ids: list[int]
    max_new_tokens: int
    method: str
    committed: list[int]
    deliver: Deliver
    sampling: SamplingParams = GREEDY
    closed: bool = False
    group: int = 0
    since: float = field(default_factory=time.perf_counter)  # submitted, or its last event out

    @property
    def resumed(self) -> bool:
        return len(self.committed) > len(self.prompt_ids)


class StepLoop:
    """The per-replica step loop (see module doc). `decoder(method)`: the decoder of a method
    (an unknown one raises); `lock` guards the models against other callers of the same replica;
    the loop counts into the replica's `counters` (prefills, resumes, rounds per request) and
    `batch_sizes` (rows of each batched round)."""

    def __init__(self, decoder: Callable[[str], SpeculativeDecoder], max_batch: int,
                 batch_wait_ms: float, lock: BusyLock, counters: dict[str, int],
                 batch_sizes: collections.Counter, groups: int = 1) -> None:
        if max_batch < 1:
            raise ValueError(f"serving.max_batch={max_batch}; must be >= 1")
        if groups < 1:
            raise ValueError(f"serving.split_groups={groups}; must be >= 1")
        self.decoder, self.max_batch, self.wait_s = decoder, max_batch, batch_wait_ms / 1e3
        self.lock, self.counters, self.batch_sizes = lock, counters, batch_sizes
        self._cond = threading.Condition()
        self._groups: list[Group[Ticket]] = [Group(g) for g in range(groups)]
        self._threads: dict[int, threading.Thread] = {}
        self._dealt = 0
        self._open: set[Ticket] = set()

    @property
    def open(self) -> int:
        """Requests submitted and not closed yet."""
        return len(self._open)

    @property
    def solo(self) -> bool:
        """At most one group has requests (a remote drafter's Drafter would otherwise idle
        while it verifies)."""
        return solo(self._groups)

    def submit(self, ticket: Ticket) -> Ticket:
        """Queue a request; its events go to `ticket.deliver` from its group's thread."""
        self.decoder(ticket.method)  # an unknown method fails here, in the caller
        with self._cond:
            group = deal(self._groups, self._dealt)
            self._dealt += 1
            ticket.group = group.index
            self._open.add(ticket)
            group.waiting.append(ticket)
            if group.index not in self._threads:
                thread = threading.Thread(target=self._run, args=(group,), daemon=True,
                                          name=f"peftbd-step-loop-{group.index}")
                self._threads[group.index] = thread
                thread.start()
            self._cond.notify_all()
        return ticket

    def close(self, ticket: Ticket) -> None:
        """The request is over (finished, or its consumer left): it leaves before the next step."""
        with self._cond:
            if not ticket.closed:
                ticket.closed = True
                self._groups[ticket.group].closing.append(ticket)
            self._open.discard(ticket)

    # a group's thread ----------------------------------------------------------------------

    def _run(self, group: Group[Ticket]) -> None:
        with torch.inference_mode():
            while True:
                for ticket in self._newcomers(group):
                    self._scheduler(group, ticket.method).add(
                        ticket, ticket.committed, ticket.max_new_tokens, ticket.sampling,
                        len(ticket.prompt_ids))
                method = group.next_method()
                if method is not None:
                    self._step(group.schedulers[method])

    def _scheduler(self, group: Group[Ticket], method: str) -> Scheduler[DecodeState]:
        dec = self.decoder(method)
        return group.scheduler(method, lambda: dec.twin() if group.index else dec, self.max_batch)

    def _newcomers(self, group: Group[Ticket]) -> list[Ticket]:
        """The group's waiting requests, its closed ones cancelled; blocks while it has nothing
        to do, and an idle group waits up to `batch_wait_ms` for a batch that is not full."""
        with self._cond:
            while group.idle:
                self._cond.wait()
            deadline = time.monotonic() + self.wait_s
            while group.batching(self.max_batch) and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            taken = [t for t in group.waiting if not t.closed]
            closing, group.waiting, group.closing = group.closing, [], []
        for ticket in closing:
            scheduler = group.schedulers.get(ticket.method)
            if scheduler is not None:
                for state in scheduler.cancel(ticket):
                    _release(scheduler, state)
        return taken

    def _step(self, scheduler: Scheduler[DecodeState]) -> None:
        """One step of `scheduler`: its prefill chunk, whose finished requests' events go out
        at once, then its round and each request's event of it."""
        try:
            with self.lock:
                self._deliver(scheduler, scheduler.prefill())
                self._deliver(scheduler, scheduler.round())
        except Exception as exc:  # a bug: fail these requests, keep serving the others
            self._fail(scheduler.abort(), exc)

    def _deliver(self, scheduler: Scheduler[DecodeState], stepped: list[Stepped[DecodeState]]) -> None:
        rounds = [s for s in stepped if not s.prefill]
        if rounds:
            self.counters["rounds"] += len(rounds)
            self.batch_sizes[rounds[0].batch_size] += 1
        for s in stepped:
            ticket = s.key
            assert isinstance(ticket, Ticket)
            if s.prefill:
                self.counters["resumes" if ticket.resumed else "prefills"] += 1
            if s.done:
                _release(scheduler, s.state)
            now = time.perf_counter()
            since, ticket.since = ticket.since, now
            self._send(ticket, step_event(s, int(ticket.resumed), (now - since) * 1e3))

    def _send(self, ticket: Ticket, item: RoundEvent | BaseException) -> None:
        if ticket.closed:
            return
        try:
            ticket.deliver(item)
        except RuntimeError:  # the consumer's event loop is gone: nobody is listening
            self.close(ticket)

    def _fail(self, tickets: Sequence[object], exc: Exception) -> None:
        for t in tickets:
            assert isinstance(t, Ticket)
            self._send(t, exc)
            self.close(t)


def _release(scheduler: Scheduler[DecodeState], state: DecodeState) -> None:
    """A finished or cancelled request's drafter-side state goes (a remote drafter's session)."""
    assert isinstance(scheduler.decoder, SpeculativeDecoder)
    release = getattr(scheduler.decoder.drafter, "release", None)
    if release is not None:
        release(state)


def step_event(s: Stepped[DecodeState], resumes: int, replica_ms: float | None = None) -> RoundEvent:
    """A request's event of one scheduler step: its prefill (`resumes`: 1 when it rebuilt a
    resumed request), or its round of the batch (the batch's draft and verify times). A round
    drafted by a remote Drafter takes that replica's draft and sync times, its rebuilds, and the
    call's hops as `transport_ms`. `replica_ms`: this replica's time since the request's
    previous event (or its arrival); what no part of the step took of it is `queued_ms`."""
    finish = finish_reason(s.state) if s.done else None
    if s.record is None:
        event = RoundEvent(tokens=s.tokens, other_ms=s.state.prefill_s * 1e3, resumes=resumes,
                           done=s.done, prefill=True, finish_reason=finish,
                           batch_size=s.batch_size)
    else:
        rec = s.record
        event = RoundEvent(
            tokens=s.tokens, proposed=rec.proposed, accepted=rec.accepted, draft_ms=rec.draft_ms,
            verify_ms=rec.verify_ms, other_ms=rec.other_ms, done=s.done, finish_reason=finish,
            batch_size=s.batch_size,
        )
        remote = s.state.drafter_state
        if isinstance(remote, Remote):
            last = remote.last
            event.draft_ms, event.sync_ms = last.draft_ms, last.sync_ms
            event.other_ms += max(last.handler_ms - last.draft_ms - last.sync_ms, 0.0)
            event.transport_ms = max(last.call_ms - last.handler_ms, 0.0)
            event.resumes, event.feature_bytes = int(last.resumed), last.feature_bytes
            event.pre_drafted = last.pre_drafted
    if replica_ms is not None:
        event.queued_ms = max(replica_ms - event.compute_ms - event.transport_ms, 0.0)
    return event


def finish_reason(state: DecodeState) -> FinishReason | None:
    """`stop` when a finished request ended on EOS, `length` when on its budget, else None."""
    if not state.done:
        return None
    return "stop" if state.tokens[-1] in state.eos_ids else "length"
