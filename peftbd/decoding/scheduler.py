"""The engine's scheduler: continuous batching over rounds, as vLLM v1's scheduler steps.

Requests are `add`ed and the caller `step`s until `busy` is false. A step admits waiting
requests while fewer than `max_batch` run (each takes a row of the decoder's KV pool), runs at
most one packed prefill forward of at most `decoding.prefill_chunk` tokens over the prompts of
the admitted requests not yet prefilled (a long prompt takes several steps;
`peftbd.decoding.packed`), then one round (one batched propose, one batched verify) of every
running request whose prefill is done; requests that finished leave, and their rows go back to
the pool. So a burst of arrivals costs the rounds in flight one chunk per round, never a stall
for the whole burst (chunked prefill as vLLM and Sarathi schedule it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from peftbd.decoding.drafter import Drafter
from peftbd.decoding.fast_path import ForwardPath
from peftbd.decoding.ragged import RaggedKV
from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.decoding.state import DecodeState, RoundMetrics
from peftbd.decoding.verify import new_state, prefill_step


class Engine(Protocol):
    """What the scheduler steps: a `peftbd.decoding.loop.SpeculativeDecoder`."""

    model: torch.nn.Module
    drafter: Drafter
    eos_ids: tuple[int, ...]
    path: ForwardPath
    pool: RaggedKV
    prefill_chunk: int
    verifier_steps: int

    def step_many(self, states: Sequence[DecodeState]) -> list[RoundMetrics]: ...


@dataclass(frozen=True)
class Queued:
    """A request waiting for a row: its caller's key, prompt, budget and sampling."""

    key: object
    prompt: Sequence[int]
    max_new_tokens: int
    sampling: SamplingParams = GREEDY


@dataclass(eq=False)
class Running:
    """An admitted request: its state, and whether its prompt is prefilled."""

    key: object
    state: DecodeState
    prefilled: bool


@dataclass
class Scheduler:
    """Continuous batching of one `SpeculativeDecoder`'s requests (see module doc)."""

    decoder: Engine
    max_batch: int
    waiting: deque[Queued] = field(default_factory=deque)
    running: list[Running] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"batch_size={self.max_batch}; decoding.batch_sizes entries must be >= 1")

    @property
    def busy(self) -> bool:
        """Requests are waiting or running."""
        return bool(self.waiting or self.running)

    def add(self, key: object, prompt: Sequence[int], max_new_tokens: int,
            sampling: SamplingParams = GREEDY) -> None:
        """Queue a request; `step` returns it with `key` when it finished."""
        self.waiting.append(Queued(key, prompt, max_new_tokens, sampling))

    def step(self) -> list[tuple[object, DecodeState]]:
        """Admit, one prefill chunk, one round of the prefilled requests; the finished ones."""
        dec = self.decoder
        while self.waiting and len(self.running) < self.max_batch:
            q = self.waiting.popleft()
            state = new_state(dec.model, q.prompt, q.max_new_tokens, dec.eos_ids,
                              dec.drafter.feature_layers, q.sampling, dec.path, dec.pool)
            self.running.append(Running(q.key, state, state.done))  # a budget of 0: no prefill
        filling = [r for r in self.running if not r.prefilled]
        if filling:
            done = {id(s) for s in prefill_step(dec.model, [r.state for r in filling], dec.prefill_chunk)}
            dec.verifier_steps += 1
            for req in filling:
                if id(req.state) in done:
                    req.prefilled = True
                    dec.drafter.start(req.state)
        live = [r.state for r in self.running if r.prefilled and not r.state.done]
        if live:
            dec.step_many(live)
        finished = [r for r in self.running if r.prefilled and r.state.done]
        self.running = [r for r in self.running if not (r.prefilled and r.state.done)]
        for req in finished:
            req.state.cache.release()
        return [(r.key, r.state) for r in finished]
