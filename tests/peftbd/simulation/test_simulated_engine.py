"""The simulated engine under the engine's own scheduler: the same requests step exactly as on
the real engine at controlled acceptance (same admissions, prefill chunks, batches and accepted
tokens per round), and the virtual clock serves its devices first come first served."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from peftbd.data.chat import encode_prompt
from peftbd.decoding import NoDrafter, SpeculativeDecoder
from peftbd.decoding.controlled import AcceptanceProfile, ControlledDrafter, reference_oracle
from peftbd.decoding.scheduler import Scheduler, Stepped
from peftbd.models.loading import load_tokenizer, load_verifier
from peftbd.serving.step_policy import Group, deal
from peftbd.simulation.clock import Device, Hold, Process, VirtualClock, Wait
from peftbd.simulation.engine import SimulatedEngine
from peftbd.simulation.shapes import ForwardShape

POSITIONS, BUDGET, CHUNK = 4, 12, 16


class _Zeros(NoDrafter):
    """Drafts zeros (the controlled drafter rewrites them), as many as the budget allows."""

    name = "zeros"

    def propose(self, states, max_tokens) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
        return [torch.zeros(1, min(POSITIONS, m), dtype=torch.long) for m in max_tokens]


class _Flat:
    name = "flat"

    def forward_ms(self, shape: ForwardShape) -> float:
        return {"prefill": 1.0, "draft": 2.0, "verify": 3.0}[shape.kind]

    def hop_ms(self, payload_bytes: int) -> float:
        return 0.5


def _trace(scheduler: Scheduler, prompts: Sequence[list[int]]) -> list[list[tuple]]:
    for i, p in enumerate(prompts):
        scheduler.add(i, p, BUDGET)
    steps = []
    while scheduler.busy:
        stepped: list[Stepped] = scheduler.step()
        steps.append([(s.key, s.prefill, s.batch_size, len(s.tokens), s.done,
                       s.record and (s.record.proposed, s.record.accepted)) for s in stepped])
    return steps


def test_simulated_requests_step_as_the_real_engine_at_controlled_acceptance(tiny_cfg, tiny_world):
    tokenizer, verifier = load_tokenizer(tiny_cfg), load_verifier(tiny_cfg)
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": q * (i + 1)}])
               for i, q in enumerate(["Say hi. ", "Count to three. ", "Name a colour. ", "Why? "])]
    ar = SpeculativeDecoder(verifier, None, (), BUDGET)
    oracle = reference_oracle({tuple(p): ar.decode(p).tokens for p in prompts})
    profile = AcceptanceProfile.with_mean(2.5, POSITIONS)
    real = SpeculativeDecoder(verifier, ControlledDrafter(_Zeros(), profile, oracle, seed=3), (),
                              BUDGET, prefill_chunk=CHUNK)
    simulated = SimulatedEngine("zeros", POSITIONS, profile, _Flat(), CHUNK, seed=3)
    with torch.inference_mode():
        expected = _trace(Scheduler(real, 3), prompts)
    got = _trace(Scheduler(simulated, 3), prompts)
    assert got == expected
    assert any(len(step) > 1 for step in got)  # batches of several, chunks across steps
    assert any(acc for step in got for *_, rec in step if rec for acc in rec[1:])


def test_the_clock_serves_a_device_first_come_first_served_and_times_out_waits():
    clock, device = VirtualClock(), Device("gpu")
    ends: dict[str, float] = {}
    signal = clock.signal()

    def user(name: str, delay: float, ms: float) -> Process:
        yield Hold(None, delay)
        yield Hold(device, ms)
        ends[name] = clock.now

    def waiter(name: str, timeout: float | None) -> Process:
        yield Wait(signal, timeout)
        ends[name] = clock.now

    def firer() -> Process:
        yield Hold(None, 7.0)
        signal.fire()

    for proc in (user("a", 0.0, 5.0), user("b", 1.0, 5.0), user("c", 20.0, 1.0),
                 waiter("short", 2.0), waiter("long", 100.0), firer()):
        clock.spawn(proc)
    assert clock.run() == 21.0
    assert ends == {"a": 5.0, "b": 10.0, "c": 21.0, "short": 2.0, "long": 7.0}
    assert device.busy_fraction(0.0, 10.0) == 1.0
    assert device.busy_fraction(0.0, 20.0) == 0.5


def test_the_step_policy_deals_round_robin_waits_for_a_batch_and_alternates_methods():
    groups: list[Group[str]] = [Group(0), Group(1)]
    assert [deal(groups, n).index for n in range(5)] == [0, 1, 0, 1, 0]
    g = groups[0]
    assert g.idle and not g.batching(2)
    g.waiting.append("r")
    assert not g.idle and g.batching(2) and not g.batching(1)
    engine = SimulatedEngine("ar", 0, None, _Flat(), CHUNK)
    for method in ("a", "b"):
        g.scheduler(method, lambda: engine, 4).add(method, [1, 2], 3)
    assert g.busy and not g.batching(4)
    assert [g.next_method() for _ in range(4)] == ["b", "a", "b", "a"]


def test_an_engine_needs_a_profile_when_it_drafts():
    with pytest.raises(ValueError, match="acceptance profile"):
        SimulatedEngine("peftbd", 16, None, _Flat(), CHUNK)
