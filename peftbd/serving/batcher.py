"""A colocated replica's step loop: the concurrent requests of one replica decoded together.

Requests `submit` themselves and get their `RoundEvent`s through their own `deliver` callback
(a queue per request). One background thread runs the loop, as vLLM's scheduler does for greedy
requests: admit the waiting requests (one batched prefill per method, at most `max_batch` running
per method; an idle replica waits up to `batch_wait_ms` for more to arrive), then step one
method's running batch one round (`step_many`: one batched draft, one batched verify), deliver
each row's event, and drop the rows that finished or whose request was closed. Requests of
different methods never share a forward (the PEFT-BD adapter switch is model-wide): each method
keeps its own running batch and the loop alternates between them, round by round.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from peftbd.decoding import DecodeState, RoundMetrics
from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.decoding.state import present
from peftbd.serving.busy_lock import BusyLock
from peftbd.serving.models import ServingModels
from peftbd.serving.rounds import RoundEvent
from peftbd.serving.schemas import FinishReason
from peftbd.serving.sessions import resume_many

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
    state: DecodeState | None = None
    closed: bool = False

    @property
    def resumed(self) -> bool:
        return len(self.committed) > len(self.prompt_ids)


class StepLoop:
    """The per-replica step loop (see module doc). `lock` guards the models against other
    callers of the same replica (split calls); the loop counts into the replica's `counters`
    (prefills, resumes, rounds per request) and `batch_sizes` (rows of each batched step)."""

    def __init__(self, models: ServingModels, max_batch: int, batch_wait_ms: float,
                 lock: BusyLock, counters: dict[str, int],
                 batch_sizes: collections.Counter) -> None:
        if max_batch < 1:
            raise ValueError(f"serving.max_batch={max_batch}; must be >= 1")
        self.models, self.max_batch, self.wait_s = models, max_batch, batch_wait_ms / 1e3
        self.lock, self.counters, self.batch_sizes = lock, counters, batch_sizes
        self._cond = threading.Condition()
        self._waiting: list[Ticket] = []
        self._running: dict[str, list[Ticket]] = {}
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
            ticket.closed = True
            self._open.discard(ticket)

    # the loop's thread ---------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                self._admit(self._newcomers())
                method = self._next_method()
                if method is not None:
                    self._step(method)

    def _newcomers(self) -> list[Ticket]:
        """The waiting requests that fit; blocks while there is nothing to do, and an idle
        replica waits up to `batch_wait_ms` for a batch that is not full."""
        with self._cond:
            while not self._waiting and not self._busy():
                self._cond.wait()
            if self._waiting and not self._busy():
                deadline = time.monotonic() + self.wait_s
                while len(self._waiting) < self.max_batch and time.monotonic() < deadline:
                    self._cond.wait(deadline - time.monotonic())
            taken, left = [], []
            room = {m: self.max_batch - len(r) for m, r in self._running.items()}
            for t in self._waiting:
                if t.closed:
                    continue
                if room.get(t.method, self.max_batch) > 0:
                    room[t.method] = room.get(t.method, self.max_batch) - 1
                    taken.append(t)
                else:
                    left.append(t)
            self._waiting = left
            return taken

    def _busy(self) -> bool:
        return any(self._running.values())

    def _admit(self, tickets: Sequence[Ticket]) -> None:
        """One batched prefill per method for fresh requests, one batched rebuild for resumed
        ones (`resume_many`); each gets its prefill event and joins its method's batch."""
        by_kind: dict[tuple[str, bool], list[Ticket]] = collections.defaultdict(list)
        for t in tickets:
            by_kind[(t.method, t.resumed)].append(t)
        for (method, resumed), group in by_kind.items():
            dec = self.models.decoder(method)
            try:
                with self.lock:
                    if resumed:
                        states = resume_many(dec, [t.committed for t in group],
                                             [len(t.prompt_ids) for t in group],
                                             [t.max_new_tokens for t in group],
                                             [t.sampling for t in group])
                        self.counters["resumes"] += len(group)
                    else:
                        states = dec.start_many([t.prompt_ids for t in group],
                                                [t.max_new_tokens for t in group],
                                                [t.sampling for t in group])
                        self.counters["prefills"] += len(group)
            except Exception as exc:  # a bug: fail these requests, keep serving the others
                self._fail(group, exc)
                continue
            for t, state in zip(group, states):
                t.state = state
                self._send(t, RoundEvent(
                    tokens=[] if resumed else state.new_tokens, other_ms=state.prefill_s * 1e3,
                    resumes=int(resumed), done=state.done, prefill=True,
                    finish_reason=finish_reason(state), batch_size=len(group)))
                if not state.done and not t.closed:
                    self._running.setdefault(method, []).append(t)

    def _next_method(self) -> str | None:
        """The next method (round robin) with a running request still open."""
        with self._cond:
            for method in list(self._running):
                self._running[method] = [t for t in self._running[method] if not t.closed]
            methods = [m for m, r in self._running.items() if r]
        if not methods:
            return None
        self._turn = (self._turn + 1) % len(methods)
        return methods[self._turn]

    def _step(self, method: str) -> None:
        """One round of `method`'s running batch; finished rows leave it."""
        batch = self._running[method]
        try:
            states = [present(t.state, "a running ticket's state") for t in batch]
            with self.lock:
                records = self.models.decoder(method).step_many(states)
        except Exception as exc:
            self._running[method] = []
            self._fail(batch, exc)
            return
        self.counters["rounds"] += len(batch)
        self.batch_sizes[len(batch)] += 1
        for t, state, rec in zip(batch, states, records):
            self._send(t, round_event(state, rec, len(batch)))
        self._running[method] = [t for t, s in zip(batch, states) if not s.done and not t.closed]

    def _send(self, ticket: Ticket, item: RoundEvent | BaseException) -> None:
        if ticket.closed:
            return
        try:
            ticket.deliver(item)
        except RuntimeError:  # the consumer's event loop is gone: nobody is listening
            self.close(ticket)

    def _fail(self, tickets: Sequence[Ticket], exc: Exception) -> None:
        for t in tickets:
            self._send(t, exc)
            self.close(t)


def round_event(state: DecodeState, rec: RoundMetrics, batch_size: int) -> RoundEvent:
    """A request's event of one batched round (the batch's draft and verify times)."""
    return RoundEvent(
        tokens=state.tokens[len(state.tokens) - rec.emitted:], proposed=rec.proposed,
        accepted=rec.accepted, draft_ms=rec.draft_ms, verify_ms=rec.verify_ms,
        other_ms=rec.other_ms, done=state.done, finish_reason=finish_reason(state),
        batch_size=batch_size,
    )


def finish_reason(state: DecodeState) -> FinishReason | None:
    """`stop` when a finished request ended on EOS, `length` when on its budget, else None."""
    if not state.done:
        return None
    return "stop" if state.tokens[-1] in state.eos_ids else "length"
