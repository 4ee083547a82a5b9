"""The engine's scheduler: continuous batching over rounds, as vLLM v1's scheduler steps. Every
caller runs its requests through it: the benchmark and generate (`decode_many`), a colocated
serving replica and a split Verifier, whose drafter proposes through the Drafter deployment
(`peftbd.serving.batcher`, `peftbd.serving.remote_drafter`), and the placement simulator, whose
engine prices each forward on a virtual clock (`Engine`, `peftbd.simulation`).

Requests are `add`ed and the caller `step`s until `busy` is false. A step admits waiting
requests while fewer than `max_batch` run (each takes a row of the decoder's KV pool), runs at
most one packed prefill forward of at most `decoding.prefill_chunk` tokens over the prompts of
the admitted requests not yet prefilled (a long prompt takes several steps;
`peftbd.decoding.packed`), then one round (one batched propose, one batched verify) of every
running request whose prefill is done; requests that finished leave, and their rows go back to
the pool. So a burst of arrivals costs the rounds in flight one chunk per round, never a stall
for the whole burst (chunked prefill as vLLM and Sarathi schedule it). A step reports what it
did for each request (`Stepped`: a prefill finished, or a round); `cancel` takes a request out
(its client left), and a request queued with tokens it already generated resumes from them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.decoding.state import RoundMetrics


class Request(Protocol):
    """What the scheduler reads and writes of a request's state (`DecodeState`; a simulated
    engine's lighter state, `peftbd.simulation.engine`)."""

    tokens: list[int]
    prompt_len: int
    max_new_tokens: int
    eos_ids: frozenset[int]
    done: bool

    @property
    def new_tokens(self) -> list[int]: ...

    @property
    def remaining(self) -> int: ...


S = TypeVar("S", bound=Request)


class Engine(Protocol[S]):
    """What the scheduler steps: a `peftbd.decoding.loop.SpeculativeDecoder`, or a simulated
    engine that prices each forward on a virtual clock instead of running it
    (`peftbd.simulation.engine.SimulatedEngine`)."""

    def admit(self, tokens: Sequence[int], max_new_tokens: int, sampling: SamplingParams) -> S:
        """A request's state before any forward: a row of the engine's KV pool."""

    def prefill(self, states: Sequence[S]) -> list[S]:
        """One packed prefill chunk over `states` (in order); those whose prompt it finished
        (first token committed, drafter started)."""

    def step_many(self, states: Sequence[S]) -> list[RoundMetrics]:
        """One round of every state: one batched propose, one batched verify."""

    def release(self, state: S) -> None:
        """The request left: its row goes back to the pool."""


@dataclass(frozen=True)
class Queued:
    """A request waiting for a row: its caller's key, committed tokens, budget and sampling.
    `prompt_len` < len(`tokens`) resumes a request from tokens already generated (its replica
    died, or its caller rebuilds it): the prefill then covers `tokens[:-1]` and commits nothing."""

    key: object
    tokens: Sequence[int]
    max_new_tokens: int
    sampling: SamplingParams = GREEDY
    prompt_len: int | None = None

    @property
    def resumed(self) -> bool:
        return self.prompt_len is not None and self.prompt_len < len(self.tokens)


@dataclass(eq=False)
class Running(Generic[S]):
    """An admitted request: its state, whether its prompt is prefilled, and how it was queued."""

    queued: Queued
    state: S
    prefilled: bool


@dataclass(frozen=True)
class Stepped(Generic[S]):
    """What one step did for one request: finished its prefill (`record` None) or took a round
    (`record`); `tokens` it committed then (a resumed request's prefill: none), `done` whether
    that finished it, `batch_size` the rows of the forward."""

    key: object
    state: S
    tokens: list[int]
    done: bool
    record: RoundMetrics | None
    batch_size: int

    @property
    def prefill(self) -> bool:
        return self.record is None


@dataclass
class Scheduler(Generic[S]):
    """Continuous batching of one engine's requests (see module doc)."""

    decoder: Engine[S]
    max_batch: int
    waiting: deque[Queued] = field(default_factory=deque)
    running: list[Running[S]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch={self.max_batch}; decoding.batch_sizes and "
                             "serving.max_batch entries must be >= 1")

    @property
    def busy(self) -> bool:
        """Requests are waiting or running."""
        return bool(self.waiting or self.running)

    def add(self, key: object, tokens: Sequence[int], max_new_tokens: int,
            sampling: SamplingParams = GREEDY, prompt_len: int | None = None) -> None:
        """Queue a request (`Queued`); `step` reports it under `key`."""
        if prompt_len is not None and not 0 < prompt_len <= len(tokens):
            raise ValueError(f"prompt_len={prompt_len} of {len(tokens)} committed tokens; a resumed "
                             "request needs 0 < prompt_len <= len(tokens)")
        self.waiting.append(Queued(key, tokens, max_new_tokens, sampling, prompt_len))

    def cancel(self, key: object) -> list[S]:
        """Take the request `key` out (waiting or running: its row goes back to the pool); the
        state it had, if it was running."""
        self.waiting = deque(q for q in self.waiting if q.key is not key)
        gone = [r for r in self.running if r.queued.key is key]
        for req in gone:
            self.decoder.release(req.state)
            self.running.remove(req)
        return [r.state for r in gone]

    def abort(self) -> list[object]:
        """Drop every request (a step failed: their states are not to be trusted); their keys."""
        keys = [q.key for q in self.waiting] + [r.queued.key for r in self.running]
        for req in self.running:
            self.decoder.release(req.state)
        self.waiting.clear()
        self.running.clear()
        return keys

    def step(self) -> list[Stepped[S]]:
        """Admit, one prefill chunk, one round of the prefilled: what each did (`prefill`, then
        `round`; a caller that streams reports the first's before the second runs)."""
        return self.prefill() + self.round()

    def prefill(self) -> list[Stepped[S]]:
        """Admit waiting requests while rows are free, then one packed prefill chunk over the
        admitted ones not prefilled yet: the requests whose prefill finished (and those of a
        budget of 0, done at once)."""
        stepped: list[Stepped[S]] = []
        while self.waiting and len(self.running) < self.max_batch:
            q = self.waiting.popleft()
            tokens, budget = (q.tokens[:-1], 1) if q.resumed else (q.tokens, q.max_new_tokens)
            state = self.decoder.admit(tokens, budget, q.sampling)
            self.running.append(Running(q, state, state.done))
            if state.done:  # a budget of 0: no prefill, done at once
                stepped.append(Stepped(q.key, state, [], True, None, 0))
        filling = [r for r in self.running if not r.prefilled]
        if filling:
            done = {id(s) for s in self.decoder.prefill([r.state for r in filling])}
            for req in filling:
                if id(req.state) in done:
                    req.prefilled = True
                    q = req.queued
                    if q.resumed:
                        resumed(req.state, q.tokens, q.prompt_len or 0, q.max_new_tokens)
                    stepped.append(Stepped(q.key, req.state, [] if q.resumed else req.state.new_tokens,
                                           req.state.done, None, len(filling)))
        self._leave()
        return stepped

    def round(self) -> list[Stepped[S]]:
        """One round (one batched propose, one batched verify) of every prefilled request: what
        each committed."""
        stepped: list[Stepped[S]] = []
        live = [r for r in self.running if r.prefilled and not r.state.done]
        if live:
            records = self.decoder.step_many([r.state for r in live])
            for req, rec in zip(live, records):
                state = req.state
                stepped.append(Stepped(req.queued.key, state, state.tokens[len(state.tokens) - rec.emitted:],
                                       state.done, rec, len(live)))
        self._leave()
        return stepped

    def _leave(self) -> None:
        """Finished requests leave; their rows go back to the pool."""
        for req in [r for r in self.running if r.prefilled and r.state.done]:
            self.decoder.release(req.state)
            self.running.remove(req)


def resumed(state: S, committed: Sequence[int], prompt_len: int, max_new_tokens: int) -> S:
    """A state prefilled over `committed[:-1]` (with a budget of one token) made the state of the
    request that committed exactly `committed`: the caller's last token in place of the one the
    prefill chose, its prompt length and budget restored. The cache then holds the verifier KV of
    `committed[:-1]` and `hidden` the states that predicted `committed[1:]`, the engine's
    between-rounds invariant."""
    state.tokens[-1] = committed[-1]
    state.prompt_len = prompt_len
    state.max_new_tokens = max_new_tokens
    state.done = committed[-1] in state.eos_ids or state.remaining <= 0
    return state
