"""The one decoding loop: prefill, then rounds of (drafter proposes, verifier verifies) until EOS
or the token budget. AR (greedy or sampled) is the same loop with `NoDrafter`."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from peftbd.decoding.drafter import Drafter, NoDrafter, draft_forward, draft_on_path
from peftbd.decoding.metrics import DecodeResult
from peftbd.decoding.packed import PREFILL_CHUNK
from peftbd.decoding.ragged import RaggedKV
from peftbd.decoding.scheduler import Scheduler
from peftbd.models.cpu_linear import prepack_linears
from peftbd.decoding.sampling import GREEDY, SamplingParams, per_request
from peftbd.decoding.state import DecodeState, RoundMetrics
from peftbd.decoding.fast_path import EAGER, FastPath, FastPathSetting, ForwardPath, fast_path_on
from peftbd.decoding.verify import (
    VerifyResult,
    model_device,
    new_state,
    prefill_rows,
    prefill_step,
    verify_rows,
)

POOL_ROOM = 128
"""Slots per pool row past a request's tokens that `SpeculativeDecoder.reserve` adds: a round's
draft and verify chunks (a D=16 block each) and the fast path's 64-slot bucket of what a graph
reads, with a spare."""


class SpeculativeDecoder:
    """Speculative decoding of one verifier with one drafter (None = AR), over any number of
    requests at once, each greedy or sampled (`SamplingParams`, per request: lossless, see
    `peftbd.decoding.sampling`).

    `decode` runs one request, `decode_many` a stream of them with continuous batching. A server
    that holds a `DecodeState` per request can instead call `start` / `start_many`, then per
    round `propose` and `verify` (possibly in different processes, passing plain token lists;
    see `peftbd.decoding.verify.advance`), or `step` / `step_many` for both. Every single-request
    method is its batched twin called with one row: batch 1 is the same code path.
    `fast_path`: run every round forward compiled (`peftbd.decoding.fast_path`: `path`, its
    `compile_s` apart from steady state), the verify's and the drafter's alike ("auto": on
    CUDA only).
    `pool`: the verifier's KV of every request it runs (`peftbd.decoding.ragged`: a static slot
    pool, a row per request, batches condensed in place).
    On a CPU the model's and the drafter's large linears run on oneDNN prepacked weights
    (`peftbd.models.cpu_linear`).
    `prefill_chunk`: tokens per packed prefill forward (`peftbd.decoding.packed`).
    `verifier_steps` counts the verifier's batched forwards (each packed prefill forward and each
    batched verify: the engine steps a scheduler such as vLLM's counts).
    """

    def __init__(self, model: torch.nn.Module, drafter: Drafter | None = None,
                 eos_ids: Sequence[int] = (), max_new_tokens: int = 256,
                 fast_path: FastPathSetting = False, prefill_chunk: int = PREFILL_CHUNK) -> None:
        self.model = model
        self.drafter: Drafter = drafter or NoDrafter()
        self.eos_ids = tuple(eos_ids)
        self.max_new_tokens = max_new_tokens
        device = model_device(model)
        self.path: ForwardPath = FastPath(device) if fast_path_on(fast_path, device) else EAGER
        self.pool = RaggedKV([], device)  # the verifier's static KV slot pool: a row per request
        if device.type == "cpu":  # oneDNN prepacked weights for its linears, the drafter's too
            for module in (model, *(m for m in vars(self.drafter).values() if isinstance(m, nn.Module))):
                prepack_linears(module)
        self.prefill_chunk = prefill_chunk
        self.verifier_steps = 0

    def twin(self) -> SpeculativeDecoder:
        """A decoder over the same model, drafter and forward path with a KV pool of its own
        (another group of requests, stepped in turn with this one's)."""
        twin = copy.copy(self)
        twin.pool, twin.verifier_steps = RaggedKV([], self.pool.device), 0
        return twin

    def start(self, prompt_ids: Sequence[int], max_new_tokens: int | None = None,
              sampling: SamplingParams | None = None) -> DecodeState:
        """Prefill a new request (commits its first token) and set up the drafter's state;
        `sampling`: None = greedy."""
        return self.start_many([prompt_ids], max_new_tokens, sampling)[0]

    def start_many(self, prompts: Sequence[Sequence[int]],
                   max_new_tokens: int | Sequence[int] | None = None,
                   sampling: SamplingParams | Sequence[SamplingParams] | None = None) -> list[DecodeState]:
        """`start` of several requests with one batched prefill (`max_new_tokens`: one budget
        for all, or one per prompt; `sampling`: None = greedy, one for all, or one per prompt;
        a sampled request without a seed gets a random one, in `state.sampling.seed`)."""
        states = prefill_rows(self.model, prompts, self._budgets(len(prompts), max_new_tokens),
                              self.eos_ids, self.drafter.feature_layers,
                              per_request(sampling, len(prompts), GREEDY, SamplingParams, "sampling"),
                              self.path, self.pool, self.prefill_chunk)
        self.verifier_steps += -(-sum(len(p) for p in prompts) // self.prefill_chunk)
        for state in states:
            self.drafter.start(state)
        return states

    def admit(self, tokens: Sequence[int], max_new_tokens: int,
              sampling: SamplingParams = GREEDY) -> DecodeState:
        """A request's state before any forward, a row of the pool (the scheduler's `Engine`)."""
        return new_state(self.model, tokens, max_new_tokens, self.eos_ids,
                         self.drafter.feature_layers, sampling, self.path, self.pool)

    def prefill(self, states: Sequence[DecodeState]) -> list[DecodeState]:
        """One packed prefill forward of at most `prefill_chunk` tokens over `states`; those
        whose prompt it finished, their drafters started (the scheduler's `Engine`)."""
        done = prefill_step(self.model, states, self.prefill_chunk)
        self.verifier_steps += 1
        for state in done:
            self.drafter.start(state)
        return done

    def release(self, state: DecodeState) -> None:
        """The request left: its pool row goes back (the scheduler's `Engine`)."""
        state.cache.release()

    def _budgets(self, n: int, max_new_tokens: int | Sequence[int] | None) -> list[int]:
        return per_request(max_new_tokens, n, self.max_new_tokens, int, "max_new_tokens")

    def propose(self, state: DecodeState) -> torch.Tensor:
        """The drafter's block for the next round, never longer than the budget can use."""
        return self.propose_many([state])[0]

    def propose_many(self, states: Sequence[DecodeState]) -> list[torch.Tensor]:
        """`propose` for several requests in one batched draft."""
        return self.drafter.propose(states, [max(s.remaining - 1, 0) for s in states])

    def verify(self, state: DecodeState, draft: Sequence[int] | torch.Tensor) -> VerifyResult:
        """Verify `draft` against the verifier and commit the accepted tokens into `state`."""
        return self.verify_many([state], [draft])[0]

    def verify_many(self, states: Sequence[DecodeState],
                    drafts: Sequence[Sequence[int] | torch.Tensor]) -> list[VerifyResult]:
        """`verify` of several requests in one batched forward; each accepts its own prefix."""
        self.verifier_steps += 1
        return verify_rows(self.model, states, drafts)

    def forward_paths(self) -> dict[str, str]:
        """The path each model forward of a round runs on, "compiled" or "eager": the verify,
        and the draft if the drafter runs a model (on the verify's path when it runs its forwards
        through `state.path`, `draft_on_path`; prefill, once per request, stays eager)."""
        path = "compiled" if self.path.compiled else "eager"
        draft = path if draft_on_path(self.drafter) else "eager"
        return {"verify": path} | ({"draft": draft} if draft_forward(self.drafter) else {})

    def step(self, state: DecodeState) -> RoundMetrics:
        """One timed round: propose, verify, record."""
        return self.step_many([state])[0]

    def step_many(self, states: Sequence[DecodeState]) -> list[RoundMetrics]:
        """One timed round of every state: one batched propose, one batched verify, each row
        accepting its own prefix. Each row's record carries the whole batched calls' times."""
        clock = states[0].forwards.clock
        t_draft = clock.now()
        drafts = self.propose_many(states)
        t_verify = clock.now()
        results = self.verify_many(states, drafts)
        t_end = clock.now()
        records = []
        for state, result in zip(states, results):
            record = RoundMetrics(
                proposed=result.proposed, accepted=result.accepted, emitted=len(result.tokens),
                draft_ms=(t_verify - t_draft) * 1e3, verify_ms=(t_end - t_verify) * 1e3,
                other_ms=(t_draft - state.mark) * 1e3,  # since the row's previous round ended
            )
            state.rounds.append(record)
            state.mark = t_end
            records.append(record)
        return records

    def reserve(self, rows: int, tokens: int) -> None:
        """Size the KV pool for `rows` requests of up to `tokens` tokens each (prompt and new
        tokens; a round's chunks and the fast path's slot buckets ride on top: `POOL_ROOM`), so
        what follows grows it no more (`RaggedKV.size_for`); a run that knows what it will
        decode (the benchmark) calls it once for all of it."""
        self.pool.size_for(rows, tokens + POOL_ROOM)

    @torch.inference_mode()
    def decode(self, prompt_ids: Sequence[int], max_new_tokens: int | None = None,
               sampling: SamplingParams | None = None) -> DecodeResult:
        """Decode one request to EOS or the budget: the exact greedy output (or, `sampling`, a
        sample of the verifier's distribution) plus per-round metrics."""
        return self.decode_many([prompt_ids], 1, max_new_tokens, sampling)[0]

    @torch.inference_mode()
    def decode_many(self, prompts: Sequence[Sequence[int]], batch_size: int,
                    max_new_tokens: int | Sequence[int] | None = None,
                    sampling: SamplingParams | Sequence[SamplingParams] | None = None) -> list[DecodeResult]:
        """Decode `prompts` with continuous batching (`peftbd.decoding.scheduler`: vLLM's
        scheduler, chunked prefill included): at most `batch_size` requests run together, the
        queue's next requests joining in the places of finished ones, their prompts prefilled
        a chunk per round. `max_new_tokens`: one budget, or one per prompt; `sampling` as in
        `start_many`. Results in prompt order; each row's output is its own greedy output, or
        its own sample (a seeded row's: whatever its batch company)."""
        scheduler = Scheduler(self, batch_size)
        budgets = self._budgets(len(prompts), max_new_tokens)
        self.reserve(min(batch_size, len(prompts)),
                     max((len(p) + b for p, b in zip(prompts, budgets)), default=0))
        params = per_request(sampling, len(prompts), GREEDY, SamplingParams, "sampling")
        for i, (prompt, budget, param) in enumerate(zip(prompts, budgets, params)):
            scheduler.add(i, prompt, budget, param)
        results: dict[object, DecodeResult] = {}
        while scheduler.busy:
            results.update((s.key, result_of(s.state)) for s in scheduler.step() if s.done)
        return [results[i] for i in range(len(prompts))]


def result_of(state: DecodeState) -> DecodeResult:
    """The `DecodeResult` of a (finished) request state."""
    return DecodeResult(
        tokens=state.new_tokens, rounds=list(state.rounds), prefill_s=state.prefill_s,
        forward_calls=dict(state.forwards.calls), forward_seconds=dict(state.forwards.seconds),
    )


def decode(model: torch.nn.Module, prompt_ids: Sequence[int], drafter: Drafter | None = None,
           max_new_tokens: int = 256, eos_ids: Sequence[int] = (),
           sampling: SamplingParams | None = None) -> DecodeResult:
    """Decoding of one prompt (speculative when `drafter` is given), greedy unless `sampling`."""
    return SpeculativeDecoder(model, drafter, eos_ids, max_new_tokens).decode(prompt_ids, None, sampling)
