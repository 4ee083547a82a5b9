"""A colocated replica's step loop: the concurrent requests of one replica decoded together by
the engine's scheduler (`peftbd.decoding.scheduler.Scheduler`, the one the benchmark runs:
continuous batching, chunked packed prefill, resumes).

Requests `submit` themselves and get their `RoundEvent`s through their own `deliver` callback
(a queue per request). One background thread runs the loop: hand the waiting requests to their
method's scheduler (an idle replica first waits up to `batch_wait_ms` for a batch that is not
full), then step one method's scheduler (admit up to `max_batch`, one prefill chunk, one round
of the prefilled), deliver each request's event of that step, and cancel the requests whose
consumer closed them. Requests of different methods never share a forward (the PEFT-BD adapter
switch is model-wide): each method has its own scheduler and the loop alternates between them,
step by step.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from peftbd.decoding import DecodeState
from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.decoding.scheduler import Scheduler, Stepped
from peftbd.serving.busy_lock import BusyLock
from peftbd.serving.models import ServingModels
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

    @property
    def resumed(self) -> bool:
        return len(self.committed) > len(self.prompt_ids)


class StepLoop:
    """The per-replica step loop (see module doc). `lock` guards the models against other
    callers of the same replica (split calls); the loop counts into the replica's `counters`
    (prefills, resumes, rounds per request) and `batch_sizes` (rows of each batched round)."""

    def __init__(self, models: ServingModels, max_batch: int, batch_wait_ms: float,
                 lock: BusyLock, counters: dict[str, int],
                 batch_sizes: collections.Counter) -> None:
        if max_batch < 1:
            raise ValueError(f"serving.max_batch={max_batch}; must be >= 1")
        self.models, self.max_batch, self.wait_s = models, max_batch, batch_wait_ms / 1e3
        self.lock, self.counters, self.batch_sizes = lock, counters, batch_sizes
        self._cond = threading.Condition()
        self._waiting: list[Ticket] = []
        self._closing: list[Ticket] = []
        self._schedulers: dict[str, Scheduler] = {}
        self._open: set[Ticket] = set()
        self._turn = 0
        self._thread: threading.Thread | None = None

    @property
    def open(self) -> int:
        """Requests submitted and not closed yet."""
        return len(self._open)

    def submit(self, ticket: Ticket) -> Ticket:
        """Queue a request; its events go to `ticket.deliver` from the loop's thread."""
        self.models.decoder(ticket.method)  # an unknown method fails here, in the caller
        with self._cond:
            self._open.add(ticket)
            self._waiting.append(ticket)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="peftbd-step-loop",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        return ticket

    def close(self, ticket: Ticket) -> None:
        """The request is over (finished, or its consumer left): it leaves before the next step."""
        with self._cond:
            if not ticket.closed:
                ticket.closed = True
                self._closing.append(ticket)
            self._open.discard(ticket)

    # the loop's thread ---------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                for ticket in self._newcomers():
                    self._scheduler(ticket.method).add(
                        ticket, ticket.committed, ticket.max_new_tokens, ticket.sampling,
                        len(ticket.prompt_ids))
                method = self._next_method()
                if method is not None:
                    self._step(method)

    def _scheduler(self, method: str) -> Scheduler:
        if method not in self._schedulers:
            self._schedulers[method] = Scheduler(self.models.decoder(method), self.max_batch)
        return self._schedulers[method]

    def _newcomers(self) -> list[Ticket]:
        """The waiting requests, the closed ones cancelled; blocks while there is nothing to do,
        and an idle replica waits up to `batch_wait_ms` for a batch that is not full."""
        with self._cond:
            while not self._waiting and not self._busy():
                self._cond.wait()
            if self._waiting and not self._busy():
                deadline = time.monotonic() + self.wait_s
                while len(self._waiting) < self.max_batch and time.monotonic() < deadline:
                    self._cond.wait(deadline - time.monotonic())
            taken = [t for t in self._waiting if not t.closed]
            closing, self._waiting, self._closing = self._closing, [], []
        for ticket in closing:
            if ticket.method in self._schedulers:
                self._schedulers[ticket.method].cancel(ticket)
        return taken

    def _busy(self) -> bool:
        return any(s.busy for s in self._schedulers.values())

    def _next_method(self) -> str | None:
        """The next method (round robin) whose scheduler has requests."""
        methods = [m for m, s in self._schedulers.items() if s.busy]
        if not methods:
            return None
        self._turn = (self._turn + 1) % len(methods)
        return methods[self._turn]

    def _step(self, method: str) -> None:
        """One step of `method`'s scheduler; each request's event of it."""
        scheduler = self._schedulers[method]
        try:
            with self.lock:
                stepped = scheduler.step()
        except Exception as exc:  # a bug: fail these requests, keep serving the others
            self._fail(scheduler.abort(), exc)
            return
        rounds = [s for s in stepped if not s.prefill]
        if rounds:
            self.counters["rounds"] += len(rounds)
            self.batch_sizes[rounds[0].batch_size] += 1
        for s in stepped:
            ticket = s.key
            assert isinstance(ticket, Ticket)
            if s.prefill:
                self.counters["resumes" if ticket.resumed else "prefills"] += 1
            self._send(ticket, step_event(s, int(ticket.resumed)))

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


def step_event(s: Stepped, resumes: int) -> RoundEvent:
    """A request's event of one scheduler step: its prefill (`resumes`: 1 when it rebuilt a
    resumed request), or its round of the batch (the batch's draft and verify times)."""
    finish = finish_reason(s.state) if s.done else None
    if s.record is None:
        return RoundEvent(tokens=s.tokens, other_ms=s.state.prefill_s * 1e3, resumes=resumes,
                          done=s.done, prefill=True, finish_reason=finish, batch_size=s.batch_size)
    rec = s.record
    return RoundEvent(
        tokens=s.tokens, proposed=rec.proposed, accepted=rec.accepted, draft_ms=rec.draft_ms,
        verify_ms=rec.verify_ms, other_ms=rec.other_ms, done=s.done, finish_reason=finish,
        batch_size=s.batch_size,
    )


def finish_reason(state: DecodeState) -> FinishReason | None:
    """`stop` when a finished request ended on EOS, `length` when on its budget, else None."""
    if not state.done:
        return None
    return "stop" if state.tokens[-1] in state.eos_ids else "length"
