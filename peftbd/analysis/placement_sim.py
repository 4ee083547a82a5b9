"""The simulated section of the placement report (no Ray, no torch): the placement simulator
(`peftbd.simulation`) produces the measured experiment's `RequestRecord` / `Window` / `Devices`,
so `concurrency_summary` gives its `LoadRow`s exactly as for a measured run. Here: a simulated
run with the hardware, model and cost model it stands for (`SimulatedRun`); the simulated rows
beside repeated measurements of the same levels, each metric's 95% t-interval over the repeats
(`validate`); per (hardware, model, method) the smallest client count where split's tok/s per
device beats colocated's, the capacity per verifier device of each (placement_verdict's
definition) and the term that decides it, computed from the roles' busy fractions
(`sim_verdicts`); and placement_sim.json (`SimReport`). Markdown and figure:
`peftbd.analysis.placement_sim_report`. Everything here is labelled SIMULATED with its cost model
wherever it is printed."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from pydantic import ConfigDict

from peftbd.analysis.json_file import JsonFile
from peftbd.analysis.placement import Devices, LoadRow
from peftbd.analysis.placement_ahead import AHEAD
from peftbd.analysis.placement_verdict import Capacity, capacity, capacity_gain_of, per_verifier

TOLERANCE = 0.15
"""Simulated within this relative error of the measured mean counts as validated."""

MIN_REPEATS = 3
"""Fewer measured repeats of a level give no interval: the row is flagged."""

T_975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
"""Student's t 0.975 quantile at 1..30 degrees of freedom (scipy is no dependency)."""


def t_quantile(df: int) -> float:
    """Student's t 0.975 quantile at `df` >= 1 degrees of freedom: the table to 30, then the
    Cornish-Fisher expansion around the normal's 1.96 (within 1e-4 of the exact value there)."""
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The 95% t-interval of the mean of `values` (None: fewer than MIN_REPEATS)."""
    n = len(values)
    if n < MIN_REPEATS:
        return None
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


@dataclass(frozen=True)
class SimulatedRun:
    """One simulated placement run: the hardware and model it stands for, the cost model that
    priced its forwards, its rows (`concurrency_summary` of the simulated records) and each
    placement's devices."""

    hardware: str  # "this box", "H100", "H200"
    model: str  # "Qwen3-0.6B", "Qwen3-8B" or a preset's name
    cost_model: str
    rows: list[LoadRow]
    devices: dict[str, Devices]


@dataclass(frozen=True)
class ValidationRow:
    """One metric of one (placement, method, clients) level: its measured mean over `repeats`
    (each repeat one measured placement.json's row), the 95% t-interval of that mean (None under
    MIN_REPEATS repeats), the simulated value, (simulated - measured) / measured, and whether
    that is within the tolerance."""

    placement: str
    method: str
    concurrency: int
    metric: str  # "tok/s per device", "p50 ms", "busy <role>"
    repeats: int
    measured: float
    interval: tuple[float, float] | None
    simulated: float | None
    error: float | None
    within: bool

    @property
    def flagged(self) -> bool:
        """Measured fewer than MIN_REPEATS times (no interval)."""
        return self.repeats < MIN_REPEATS


Key = tuple[str, str, int]


def _key(r: LoadRow) -> Key:
    return r.placement, r.method, r.concurrency


def _metrics(rows: Sequence[LoadRow]) -> dict[str, Callable[[LoadRow], float | None]]:
    """The metrics validated: tok/s per device, p50 latency and each role's busy fraction."""
    out: dict[str, Callable[[LoadRow], float | None]] = {
        "tok/s per device": lambda r: r.tokens_per_s_per_device, "p50 ms": lambda r: r.p50_ms}
    for role in sorted({role for r in rows for role in r.busy}):
        out[f"busy {role}"] = _busy_of(role)
    return out


def _busy_of(role: str) -> Callable[[LoadRow], float | None]:
    return lambda r: r.busy.get(role)


def validate(measured: list[list[LoadRow]], simulated: list[LoadRow],
             tolerance: float = TOLERANCE) -> list[ValidationRow]:
    """A row per metric of every level both simulated and measured (`measured[repeat]`: one
    measured run's rows); a metric no repeat measured is left out."""
    sim = {_key(r): r for r in simulated}
    runs: dict[Key, list[LoadRow]] = {}
    for repeat in measured:
        for r in repeat:
            if _key(r) in sim:
                runs.setdefault(_key(r), []).append(r)
    out = []
    for key in sorted(runs):
        for metric, value in _metrics([*runs[key], sim[key]]).items():
            values = [v for v in map(value, runs[key]) if v is not None]
            if not values:
                continue
            mean, mine = sum(values) / len(values), value(sim[key])
            error = (mine - mean) / mean if mine is not None and mean else None
            out.append(ValidationRow(*key, metric=metric, repeats=len(values), measured=mean,
                                     interval=t_interval(values), simulated=mine, error=error,
                                     within=error is not None and abs(error) <= tolerance))
    return out


@dataclass(frozen=True)
class Comparison:
    """`placement` against `baseline` on tok/s per device at the client levels both ran:
    the smallest where it beats the baseline (None: at none up to the highest), the ratio
    there, the best ratio and where; p50 ms (baseline, placement) at the lowest level."""

    placement: str
    baseline: str
    levels: list[int]
    beats_at: int | None
    ratio_at: float | None
    best_ratio: float | None
    best_at: int | None
    p50_ms: tuple[float, float] | None


@dataclass(frozen=True)
class SimVerdict:
    """One drafting method under one split placement against colocated, simulated.

    The deciding term is read at `level` (where split first beats colocated, else the highest
    level): split / colocated tok/s per device = `utilization` (the devices' mean busy fraction,
    split's over colocated's) x `efficiency` (tokens per busy device-second, split's over
    colocated's); `term` is the factor further from 1 (the one that agrees with the outcome),
    `idle_role` split's less busy role, `busy_ratio` split's drafter busy over its verifier's."""

    hardware: str
    model: str
    cost_model: str
    method: str
    split: Comparison
    capacity: tuple[Capacity | None, Capacity | None]  # (colocated, split)
    capacity_per_verifier: tuple[float | None, float | None]
    capacity_gain: tuple[float | None, str]  # split's over colocated's ("", ">=", "<=", "unknown")
    level: int | None
    busy: dict[str, dict[str, float | None]]  # placement: role: busy fraction at `level`
    busy_ratio: float | None
    idle_role: str | None
    utilization: float | None
    efficiency: float | None
    term: str | None  # "utilization" | "efficiency" | None (busy or tok/s not simulated)
    deciding: str
    ahead: Comparison | None = None  # split-ahead against split, when simulated


def compare(rows: Sequence[LoadRow], method: str, baseline: str, placement: str) -> Comparison:
    """`placement` against `baseline` for `method` (`Comparison`)."""
    at = {p: {r.concurrency: r for r in rows if r.placement == p and r.method == method}
          for p in (baseline, placement)}
    levels = sorted(at[baseline].keys() & at[placement].keys())
    ratios = {c: b / a for c in levels if (a := at[baseline][c].tokens_per_s_per_device)
              and (b := at[placement][c].tokens_per_s_per_device) is not None}
    beats = next((c for c in ratios if ratios[c] > 1), None)
    best = max(ratios, key=ratios.__getitem__, default=None)
    low = levels[0] if levels else None
    p50 = None if low is None else (at[baseline][low].p50_ms, at[placement][low].p50_ms)
    return Comparison(placement, baseline, levels, beats, None if beats is None else ratios[beats],
                      None if best is None else ratios[best], best, p50)


def device_busy(busy: dict[str, float | None], devices: Devices) -> float | None:
    """The placement's devices' mean busy fraction: its engines' (colocated), else its drafter
    and verifier devices' weighted by how many of each (None: a role not simulated)."""
    if "engine" in busy:
        return busy["engine"]
    d, v = busy.get("drafter"), busy.get("verifier")
    if d is None or v is None or not devices.total:
        return None
    return (d * (devices.total - devices.verifiers) + v * devices.verifiers) / devices.total


def sim_verdicts(run: SimulatedRun, capacity_fraction: float) -> list[SimVerdict]:
    """A verdict per drafting method for every split placement simulated beside colocated
    (split-ahead is compared against split inside split's verdict)."""
    placements = sorted({r.placement for r in run.rows})
    if "colocated" not in placements:
        return []
    out = []
    for placement in placements:
        if placement in ("colocated", AHEAD):
            continue
        for method in sorted({r.method for r in run.rows if r.placement == placement}):
            if method != "ar" and any(r.placement == "colocated" and r.method == method
                                      for r in run.rows):
                out.append(_verdict(run, method, placement, capacity_fraction))
    return out


def _verdict(run: SimulatedRun, method: str, placement: str, fraction: float) -> SimVerdict:
    split, pair = compare(run.rows, method, "colocated", placement), ("colocated", placement)
    caps = [capacity([r for r in run.rows if r.placement == p and r.method == method], fraction)
            for p in pair]
    level = split.beats_at if split.beats_at is not None else max(split.levels, default=None)
    at = {r.placement: r for r in run.rows
          if r.method == method and r.concurrency == level and r.placement in pair}
    busy = {p: dict(r.busy) for p, r in at.items()}
    u = {p: device_busy(r.busy, run.devices[p]) for p, r in at.items()}
    eff = {p: (at[p].tokens_per_s_per_device or 0.0) / share for p, share in u.items() if share}
    uc, us = u.get("colocated"), u.get(placement)
    ratio_u = us / uc if uc and us else None
    ratio_e = eff[placement] / eff["colocated"] if ratio_u and eff["colocated"] else None
    term = None if not ratio_u or not ratio_e else (
        "utilization" if abs(math.log(ratio_u)) >= abs(math.log(ratio_e)) else "efficiency")
    roles = {k: f for k, f in busy.get(placement, {}).items() if f is not None}
    d, v = roles.get("drafter"), roles.get("verifier")
    busy_ratio = d / v if d is not None and v else None
    idle = min(roles, key=roles.__getitem__) if roles else None
    has_ahead = placement == "split" and any(r.placement == AHEAD and r.method == method
                                             for r in run.rows)
    per_device = (per_verifier(caps[0], run.devices, "colocated"),
                  per_verifier(caps[1], run.devices, placement))
    return SimVerdict(
        hardware=run.hardware, model=run.model, cost_model=run.cost_model, method=method,
        split=split, capacity=(caps[0], caps[1]), capacity_per_verifier=per_device,
        capacity_gain=capacity_gain_of((caps[0], caps[1]), per_device),
        level=level, busy=busy, busy_ratio=busy_ratio,
        idle_role=idle, utilization=ratio_u, efficiency=ratio_e, term=term,
        deciding=_deciding(term, level, u, eff, placement, idle, roles, busy_ratio),
        ahead=compare(run.rows, method, placement, AHEAD) if has_ahead else None)


def _deciding(term: str | None, level: int | None, u: dict[str, float | None],
              eff: dict[str, float], placement: str, idle: str | None,
              roles: dict[str, float], busy_ratio: float | None) -> str:
    """The deciding factor in a phrase, its numbers read off the rows at `level`."""
    if term is None:
        return f"none: busy fractions or tok/s per device not simulated at {level} clients"
    colocated, split = u["colocated"] or 0.0, u[placement] or 0.0
    if term == "utilization" and split < colocated:
        ratio = "-" if busy_ratio is None else f"{busy_ratio:.2f}"
        return (f"device utilization ({split / colocated:.2f}x): split's {idle} device idles "
                f"{1 - roles[idle or '']:.0%} at {level} clients (draft/verify busy ratio "
                f"{ratio}); colocated's devices are busy {colocated:.0%}")
    if term == "utilization":
        return (f"device utilization ({split / colocated:.2f}x): colocated's devices idle "
                f"{1 - colocated:.0%} at {level} clients, split's {1 - split:.0%} ("
                + ", ".join(f"{role} busy {f:.0%}" for role, f in sorted(roles.items())) + ")")
    return (f"tokens per busy device-second ({eff[placement] / eff['colocated']:.2f}x): split "
            f"{eff[placement]:.1f} vs colocated {eff['colocated']:.1f} at {level} clients "
            f"(colocated runs draft and verify in turn on one device, busy {colocated:.0%}; "
            f"split's devices busy {split:.0%})")


REPORT_FILE = "placement_sim.json"


class SimReport(JsonFile):
    """placement_sim.json: the simulated runs, their validation against measured repeats (None:
    not validated) and the verdicts."""

    model_config = ConfigDict(frozen=True)
    FILE: ClassVar[str] = REPORT_FILE

    runs: list[SimulatedRun]
    validation: list[ValidationRow] | None = None
    verdicts: list[SimVerdict] = []
