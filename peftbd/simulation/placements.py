"""Placements on simulated devices: closed-loop clients against colocated Engine replicas or a
split Drafter + Verifier pair, every replica's requests scheduled by the engine's own
`Scheduler` under the step loop's own decisions (`peftbd.serving.step_policy`: dealing into
groups, waiting for a batch, alternating methods), every step's forwards priced by a
`SimulatedEngine` and held on its devices of a `VirtualClock`.

A level runs as `jobs.placement` measures one: `clients` requests in flight at all times over
`jobs` (the prompt of each request), and yields the same ledger: one `RequestRecord` per request
and the level's `Window` of replica busy fractions, which `peftbd.analysis.placement` summarises
as it does measured ones. What is not this project's code is modelled and named: Serve's router
(the replica with the fewest open requests) and the ingress (`ingress_ms` a request, on no
device)."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field

from peftbd.analysis.placement import RequestRecord, Window
from peftbd.decoding.controlled import AcceptanceProfile
from peftbd.decoding.scheduler import Stepped
from peftbd.serving.roles import Role
from peftbd.serving.schemas import SpecStats
from peftbd.serving.step_policy import Group, deal, solo
from peftbd.simulation.clock import Command, Device, Hold, Process, Signal, VirtualClock, Wait
from peftbd.simulation.engine import DRAFTER, ENGINE, VERIFIER, SimState, SimulatedEngine, Use
from peftbd.simulation.shapes import CostModel

PLACEMENTS = ("colocated", "split", "split-ahead")
"""What the simulator runs: colocated Engines; split; split drafting ahead (`serving.draft_ahead`)."""


@dataclass(frozen=True)
class SimMethod:
    """A method as the simulator runs it: its serving `name`, the `label` reports give it, the
    tokens it drafts a round (0: AR), its acceptance, and the verifier state a split Verifier
    ships it per committed token."""

    name: str
    label: str
    positions: int
    profile: AcceptanceProfile | None
    ship_bytes_per_token: int = 0
    drafts_ahead: bool = False  # its drafter can pre-draft the next round (PEFT-BD's)


@dataclass(frozen=True)
class SimSetup:
    """How a placement is served: `engines` colocated Engine replicas (split: one Drafter and one
    Verifier of `groups` groups), `serving.max_batch`, `batch_wait_ms`, `decoding.prefill_chunk`,
    the ingress's `ingress_ms` a request, and the cost model of its devices."""

    placement: str
    cost: CostModel
    max_batch: int
    batch_wait_ms: float
    prefill_chunk: int
    engines: int = 2
    groups: int = 2
    ingress_ms: float = 0.0
    shared_device: bool = False  # split: its Drafter and Verifier time-share one device

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r}: the simulator runs {list(PLACEMENTS)}")

    @property
    def split(self) -> bool:
        return self.placement != "colocated"

    @property
    def devices(self) -> int:
        return self.engines if self.placement == "colocated" else 1 if self.shared_device else 2

    @property
    def verifier_devices(self) -> int:
        return self.engines if self.placement == "colocated" else 1


@dataclass(eq=False)
class _Request:
    """One request in a simulated replica: its prompt, output length, and what it took."""

    prompt: list[int]
    output: int
    done: Signal
    events: list[Stepped[SimState]] = field(default_factory=list)
    hops_ms: float = 0.0
    submitted: float = 0.0


class _Replica:
    """A replica's step loop on the virtual clock: groups of schedulers over simulated engines."""

    def __init__(self, clock: VirtualClock, setup: SimSetup, method: SimMethod,
                 devices: dict[str, Device], seed: int) -> None:
        self.clock, self.setup, self.method, self.devices, self.seed = clock, setup, method, devices, seed
        split = setup.split
        self.groups: list[Group[_Request]] = [Group(g) for g in range(setup.groups if split else 1)]
        self.wakes = [clock.signal() for _ in self.groups]
        self.engines: dict[int, SimulatedEngine] = {}
        self.ahead: dict[int, Signal] = {}  # a group's pre-draft in flight: fired when it ends
        self.open = 0
        self.dealt = 0
        for group in self.groups:
            clock.spawn(self._run(group))

    def submit(self, request: _Request) -> None:
        group = deal(self.groups, self.dealt)
        self.dealt += 1
        self.open += 1
        group.waiting.append(request)
        self.wakes[group.index].fire()

    def _engine(self, group: Group[_Request]) -> SimulatedEngine:
        m, s = self.method, self.setup
        ahead = s.placement == "split-ahead" and m.drafts_ahead
        engine = SimulatedEngine(m.name, m.positions, m.profile, s.cost, s.prefill_chunk, s.split,
                                 m.ship_bytes_per_token, self.seed,
                                 (lambda: solo(self.groups)) if ahead else None)
        self.engines[group.index] = engine
        return engine

    def _run(self, group: Group[_Request]) -> Process:
        wake, wait_ms = self.wakes[group.index], self.setup.batch_wait_ms
        while True:
            while group.idle:
                yield Wait(wake)
            deadline = self.clock.now + wait_ms
            while group.batching(self.setup.max_batch) and self.clock.now < deadline:
                yield Wait(wake, deadline - self.clock.now)
            taken, group.waiting = group.waiting, []
            for req in taken:
                group.scheduler(self.method.name, lambda: self._engine(group),
                                self.setup.max_batch).add(req, req.prompt, req.output)
            method = group.next_method()
            if method is None:
                continue
            scheduler, engine = group.schedulers[method], self.engines[group.index]
            for stepped in (scheduler.prefill, scheduler.round):
                events = stepped()
                hops = yield from self._hold(group.index, engine.take_uses())
                for event in events:
                    assert isinstance(event.key, _Request)
                    req = event.key
                    req.events.append(event)
                    req.hops_ms += hops if event.record is not None else 0.0
                    if event.done:
                        self.open -= 1
                        req.done.fire()

    def _hold(self, group: int, uses: Sequence[Use]) -> Generator[Command, None, float]:
        """Hold each use's device in turn (a hop: no device; a pre-draft started: no wait; an
        await: until the group's pre-draft ends); the hops' ms."""
        hops = 0.0
        for use in uses:
            if use.kind == "ahead":
                self.ahead[group] = self.clock.signal()
                self.clock.spawn(self._pre_draft(self.ahead[group], use))
                continue
            if use.kind == "await":
                pending = self.ahead.pop(group, None)
                if pending is not None and not pending.fired:
                    yield Wait(pending)
                yield Hold(None, use.hop)
                hops += use.hop
                continue
            yield Hold(None if use.device is None else self.devices[use.device], use.ms)
            hops += use.ms if use.device is None else 0.0
        return hops

    def _pre_draft(self, done: Signal, use: Use) -> Process:
        """A pre-draft: its hop out, then its draft on the Drafter; `done` fires at its end."""
        yield Hold(None, use.hop)
        yield Hold(self.devices[use.device or DRAFTER], use.ms)
        done.fire()


def simulate_level(setup: SimSetup, method: SimMethod, prompts: Sequence[Sequence[int]],
                   outputs: Sequence[int], jobs: Sequence[int], clients: int,
                   seed: int = 0) -> tuple[list[RequestRecord], Window]:
    """One level: `clients` closed-loop clients sending `jobs` (indices into `prompts`, each
    answered with `outputs[i]` tokens); the requests' records and the replicas' busy window."""
    clock = VirtualClock()
    if setup.placement == "colocated":
        engines = [Device(f"engine-{i}") for i in range(setup.engines)]
        replicas = [_Replica(clock, setup, method, {ENGINE: d}, seed) for d in engines]
        roles = {Role.ENGINE.value: engines}
    else:
        verifier = Device(VERIFIER)
        drafter = verifier if setup.shared_device else Device(DRAFTER)
        replicas = [_Replica(clock, setup, method, {DRAFTER: drafter, VERIFIER: verifier}, seed)]
        roles = {Role.DRAFTER.value: [drafter], Role.VERIFIER.value: [verifier]}
    queue = list(jobs)
    records: list[RequestRecord] = []

    def client() -> Process:
        while queue:
            i = queue.pop(0)
            start = clock.now
            req = _Request(list(prompts[i]), outputs[i], clock.signal(), submitted=start)
            yield Hold(None, setup.ingress_ms / 2)
            min(replicas, key=lambda r: r.open).submit(req)
            yield Wait(req.done)
            yield Hold(None, setup.ingress_ms / 2)
            records.append(_record(setup, method, i, req, clients, start, clock.now))

    for _ in range(clients):
        clock.spawn(client())
    clock.run()
    start = min(r.start_s for r in records) * 1e3
    end = max(r.end_s for r in records) * 1e3
    window = Window(setup.placement, method.label, clients,
                    {role: [d.busy_fraction(start, end) for d in devices] for role, devices in roles.items()})
    return records, window


def _record(setup: SimSetup, method: SimMethod, prompt: int, req: _Request, clients: int,
            start: float, end: float) -> RequestRecord:
    """A simulated request's ledger entry, as `jobs.placement` records a measured one."""
    rounds = [e.record for e in req.events if e.record is not None]
    prefill = [e for e in req.events if e.record is None]
    state = req.events[-1].state
    tokens = len(state.new_tokens)
    proposed = sum(r.proposed for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    compute = state.prefill_s * 1e3 + sum(r.draft_ms + r.verify_ms for r in rounds)
    spec = SpecStats(
        method=method.name, synthetic=method.profile.expected_emitted() if method.profile else None,
        rounds=len(rounds), proposed_tokens=proposed, accepted_tokens=accepted,
        tokens_per_round=(tokens - 1) / len(rounds) if rounds else 0.0,
        acceptance_rate=accepted / proposed if proposed else 0.0,
        prefill_ms=state.prefill_s * 1e3, draft_ms=sum(r.draft_ms for r in rounds),
        verify_ms=sum(r.verify_ms for r in rounds), transport_ms=req.hops_ms + setup.ingress_ms,
        queued_ms=max(end - start - compute - req.hops_ms - setup.ingress_ms, 0.0),
        mean_batch_size=sum(e.batch_size for e in req.events if e.record) / len(rounds) if rounds else 0.0,
        pre_drafted_rounds=state.pre_drafted,
        prefill_batch_size=prefill[0].batch_size if prefill else 0,
    )
    return RequestRecord(setup.placement, method.label, prompt, "", tokens, end - start, spec,
                         clients, start / 1e3, end / 1e3)
