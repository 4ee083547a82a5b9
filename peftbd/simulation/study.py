"""The two uses of the simulator: validation (a measured placement run replayed on this box's
fitted cost model, level by level) and projection (the placements on GPUs priced by the
roofline, for the paper's acceptance of each drafter). Both give a `Simulated` ledger per
placement, which `peftbd.analysis.placement` summarises as it does a measured one."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from peftbd.analysis.placement import (
    Devices,
    LoadRow,
    PlacementRun,
    RequestRecord,
    Window,
    concurrency_summary,
    one_at_a_time,
    summarize,
)
from peftbd.analysis.placement_sim import SimulatedRun, validate
from peftbd.analysis.placement_sim_summary import overall_line, validation_table
from peftbd.analysis.placement_verdict import PlacementReport
from peftbd.config import Config
from peftbd.errors import one_line
from peftbd.methods import methods
from peftbd.decoding.controlled import AcceptanceProfile
from peftbd.simulation.engine import SimState, SimulatedEngine
from peftbd.simulation.fitted_cost import FittedCost, fit_costs
from peftbd.simulation.placements import PLACEMENTS, SimMethod, SimSetup, simulate_level
from peftbd.simulation.shapes import CostModel, ForwardShape

PAPER_TOKENS_PER_ROUND = {"peftbd": 2.881, "fastmtp": 1.511, "peftbd_head": 5.3}
"""The projection's acceptance: PEFT-BD's and FastMTP's accepted tokens per step in the paper's
SGLang runs (§4, Figure 1), and the block-diffusion head's controlled 5.3 (DFlash-like
acceptance, as the benchmark's synthetic head arm)."""

PROJECTION_CLIENTS = (1, 2, 4, 8, 16, 32, 64)

DRAFTS_AHEAD = frozenset({"peftbd"})
"""The methods whose drafter pre-drafts the next round (`propose_ahead`, `peftbd.decoding.ahead`:
PEFT-BD's; the others read verifier state of the guessed tokens and answer that they cannot)."""


@dataclass(frozen=True)
class Workload:
    """The requests of a projection: prompts of `prompt_tokens`, answers of `output_tokens`
    (the paper's max generation length), a level of c clients sending max(`min_requests`,
    2c) requests."""

    prompt_tokens: int = 128
    output_tokens: int = 256
    prompts: int = 16
    min_requests: int = 32

    def jobs(self, clients: int) -> list[int]:
        return [k % self.prompts for k in range(max(self.min_requests, 2 * clients))]

    def prompt_ids(self) -> list[list[int]]:
        """Distinct placeholder prompts (acceptance draws are keyed by the prompt)."""
        return [[p + 1] * self.prompt_tokens for p in range(self.prompts)]


@dataclass
class Simulated:
    """A simulated ledger: records and busy windows per level, the devices of each placement,
    and the cost model every number came from."""

    cost_model: str
    records: list[RequestRecord] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    devices: dict[str, Devices] = field(default_factory=dict)

    def rows(self) -> list[LoadRow]:
        return concurrency_summary(self.records, self.windows, self.devices)


def run_levels(out: Simulated, setup: SimSetup, method: SimMethod, prompts: Sequence[Sequence[int]],
               outputs: Sequence[int], levels: Iterable[tuple[int, Sequence[int]]], seed: int = 0) -> None:
    """Simulate `levels` ((clients, jobs) each) of one placement and method into `out`."""
    out.devices[setup.placement] = Devices(setup.devices, setup.verifier_devices)
    for clients, jobs in levels:
        records, window = simulate_level(setup, method, prompts, outputs, jobs, clients, seed)
        out.records += records
        out.windows.append(window)


def projection_setups(cost: CostModel, gpus: int, max_batch: int, batch_wait_ms: float,
                      prefill_chunk: int, groups: int) -> list[SimSetup]:
    """The placements a projection compares on `gpus` GPUs (1 or 2): colocated, one Engine a
    GPU; split and split drafting ahead, the Drafter and Verifier sharing the one GPU or on one
    GPU each."""
    if gpus not in (1, 2):
        raise ValueError(f"gpus={gpus}: a projection compares placements on 1 or 2 GPUs")
    return [SimSetup("colocated", cost, max_batch, batch_wait_ms, prefill_chunk, engines=gpus)] + [
        SimSetup(split, cost, max_batch, batch_wait_ms, prefill_chunk, groups=groups,
                 shared_device=gpus == 1) for split in ("split", "split-ahead")]


def project(setups: Sequence[SimSetup], methods: Sequence[SimMethod], workload: Workload,
            clients: Sequence[int] = PROJECTION_CLIENTS) -> Simulated:
    """Every placement of `setups` for every method at `clients` levels."""
    out = Simulated(setups[0].cost.name)
    prompts = workload.prompt_ids()
    outputs = [workload.output_tokens] * workload.prompts
    for setup in setups:
        for method in methods:
            if setup.placement == "split-ahead" and not method.drafts_ahead:
                continue  # its Verifier stops asking: split-ahead is split
            run_levels(out, setup, method, prompts, outputs, ((c, workload.jobs(c)) for c in clients))
    return out


def paper_method(name: str, positions: int, ship_bytes_per_token: int) -> SimMethod:
    """A method at the paper's tokens per round (`PAPER_TOKENS_PER_ROUND`), labelled so."""
    tokens = PAPER_TOKENS_PER_ROUND[name]
    return SimMethod(name, f"{name} [{tokens:g}/round]", positions,
                     AcceptanceProfile.with_mean(tokens, positions), ship_bytes_per_token,
                     name in DRAFTS_AHEAD)


def replay(reports: Sequence[PlacementReport], prompts: Sequence[Sequence[int]],
           positions: dict[str, int], max_batch: int, batch_wait_ms: float, prefill_chunk: int,
           groups: int, source: str) -> tuple[Simulated, dict[tuple[str, str, int], FittedCost]]:
    """Measured placement runs (`reports`: repeats of one run over `prompts`) replayed on the
    simulator with this box's cost model fitted from all of them (`fit_costs`): each (placement,
    method, level) sends the first run's requests in its order, each answered with its measured
    number of tokens, at its method's measured tokens per round one client at a time
    (`positions`: each method's draft positions by serving name); the serving settings are the
    run's."""
    first = reports[0]
    alone = summarize([r for rep in reports for r in one_at_a_time(rep.requests)])
    costs = fit_costs([row for rep in reports for row in rep.concurrency],
                      sum(map(len, prompts)) / len(prompts), source)
    out = Simulated("fitted: this box, from " + source)
    outputs = [0] * len(prompts)
    for r in first.requests:
        outputs[r.prompt] = r.completion_tokens
    methods: dict[tuple[str, str], SimMethod] = {}
    for (placement, label, clients), cost in sorted(costs.items()):
        if placement not in PLACEMENTS:  # split-forward, the cluster placements: not simulated
            continue
        jobs = [r for r in sorted(first.requests, key=lambda r: r.start_s)
                if (r.placement, r.method, r.concurrency) == (placement, label, clients)]
        if not jobs:
            continue
        name = jobs[0].spec.method
        k = positions.get(name, 0)
        method = methods.setdefault((placement, label), SimMethod(
            name, label, k, _calibrated(alone[placement][label], k, prompts, outputs),
            drafts_ahead=name in DRAFTS_AHEAD))
        setup = SimSetup(placement, cost, max_batch, batch_wait_ms, prefill_chunk,
                         engines=first.devices[placement].total, groups=groups,
                         ingress_ms=cost.ingress_ms)
        run_levels(out, setup, method, prompts, outputs, [(clients, [r.prompt for r in jobs])])
    return out, costs


def _calibrated(run: PlacementRun, positions: int, prompts: Sequence[Sequence[int]],
                outputs: Sequence[int]) -> AcceptanceProfile | None:
    """The geometric profile whose simulated requests emit the measured tokens per round (a
    round cut short by the budget emits less than the profile's mean): bisection on the mean."""
    if not positions or not run.tokens_per_round:
        return None
    target = run.tokens_per_round
    low, high = 1.0, positions + 1.0
    for _ in range(20):
        mean = (low + high) / 2
        states = [SimState(list(p), len(p), n) for p, n in zip(prompts, outputs) if n > 1]
        if _tokens_per_round(states, AcceptanceProfile.with_mean(mean, positions), positions) < target:
            low = mean
        else:
            high = mean
    return AcceptanceProfile.with_mean((low + high) / 2, positions)


class _Free:
    """A cost model that prices nothing (acceptance alone)."""

    name = "free"

    def forward_ms(self, shape: ForwardShape) -> float:
        return 0.0

    def hop_ms(self, payload_bytes: int) -> float:
        return 0.0


def _tokens_per_round(states: Sequence[SimState], profile: AcceptanceProfile, positions: int) -> float:
    """Tokens a round emits over `states` decoded to their budgets at `profile`."""
    engine = SimulatedEngine("calibration", positions, profile, _Free(), 1 << 30)
    engine.prefill(states)
    live = [s for s in states if not s.done]
    rounds = 0
    while live:
        rounds += len(engine.step_many(live))
        live = [s for s in live if not s.done]
    return sum(len(s.new_tokens) - 1 for s in states) / max(rounds, 1)


def validation_run(cfg: Config, reports: Sequence[PlacementReport],
                   prompts: list[list[int]] | None = None) -> SimulatedRun:
    """The first measured run replayed on this box's cost model fitted from every repeat
    (`prompts`: the runs' prompts; None: the config's, as jobs.placement takes them)."""
    if prompts is None:
        from peftbd.data.sources import first_prompts, resolve_source
        from peftbd.models.loading import load_tokenizer

        prompts = first_prompts(load_tokenizer(cfg), resolve_source(cfg), cfg.decoding.num_prompts,
                                cfg.serving.max_prompt_tokens)
    s = cfg.serving
    simulated, _ = replay(reports, prompts, {m.serving: m.positions(cfg) for m in methods()},
                          s.max_batch, s.batch_wait_ms, cfg.decoding.prefill_chunk, s.split_groups,
                          f"{len(reports)} run(s) of {cfg.preset}")
    return SimulatedRun("this box", cfg.preset, simulated.cost_model, simulated.rows(), simulated.devices)


def replayed_lines(cfg: Config, report: PlacementReport, prompts: list[list[int]]) -> list[str]:
    """This run replayed on simulated devices with this box's cost model fitted from its own
    ledger (`validation_run`): measured beside SIMULATED per level (one run,
    so no interval: `python -m jobs.placement_sim --measured` with three gives them). A replay
    that fails says so in one line; the measured run is never lost over it."""
    try:
        box = validation_run(cfg, [report], prompts)
    except Exception as exc:  # noqa: BLE001 (a measurement of minutes outweighs its replay)
        return ["", f"_SIMULATED replay of this run failed ({type(exc).__name__}: "
                f"{one_line(str(exc))[:200]})._"]
    rows = validate([report.concurrency], box.rows)
    return ["", "## Measured beside SIMULATED (this run replayed on its own fitted cost)", "",
            overall_line(rows, "cost model: " + box.cost_model),
            *validation_table(rows, "cost model: " + box.cost_model)]
