"""The placement experiment's computed verdict: per drafting method and split placement, did
placement change the cost of drafting per generated token, by how much, which measured term
decides it, and the capacity gain beside the (1 + t_d / t_v) prediction of disaggregated
speculation ("Speculation at a Distance": offloading a draft of t_d per round lets a saturated
verifier of t_v per round serve that many times more clients).

Also placement.json and the placement stage's manifest sections as typed models (no Ray; here,
where every module they hold is known, and which both the placement stage and the benchmark's
report fingerprint): the placement job (`jobs.placement`) builds a `PlacementReport` from what it
measured and writes it, and every reader reads it back through `PlacementReport.read` (the
dataclasses of `peftbd.analysis.placement` and this module's `Verdict`, `RequestRecord.spec` a
`SpecStats`); the main job's report reads the manifest's `PlacementSections`. The JSON keeps the
keys and layout it had as hand-built dicts (a model field per key, in the same order)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict

from peftbd.analysis.json_file import JsonFile
from peftbd.analysis.placement import Devices, LoadRow, PlacementRun, RequestRecord, busy_words
from peftbd.analysis.placement_ahead import AHEAD, AheadVerdict
from peftbd.analysis.placement_ledger import Ledger, ledger, ledger_words, level_bound, losses
from peftbd.analysis.tables import fmt_or_dash, markdown_table

GOAL_CLIENTS, GOAL_BUSY, GOAL_PER_DEVICE, GOAL_CAPACITY = 16, 0.8, 0.9, 1.5
"""The placement goals at GOAL_CLIENTS clients: both split replicas busy >= GOAL_BUSY; split tok/s
per device >= GOAL_PER_DEVICE x colocated's; capacity per verifier device >= GOAL_CAPACITY x."""


@dataclass(frozen=True)
class Capacity:
    """The most clients measured that each still got >= the fraction of one client's tok/s;
    `censored`: every level measured passed, so the true capacity is at least `clients`;
    `baseline`: only the lowest level passed (which always does), so the true capacity lies
    somewhere below the next level: no number to divide. `floor_tps`: the per-client tok/s each
    client had to keep (the fraction of this placement's own one-client tok/s), so capacities of
    placements whose one client runs at different speeds are read with their floors."""

    clients: int
    censored: bool
    baseline: bool = False
    floor_tps: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class Verdict:
    """One drafting method under one split placement against colocated."""

    method: str
    placement: str
    draft_ms_per_token: tuple[float | None, float | None]  # (colocated, split)
    clients: int  # the concurrency the throughput terms are read at
    per_device: tuple[float | None, float | None]  # tok/s per device (colocated, split)
    capacity: tuple[Capacity | None, Capacity | None]
    capacity_per_verifier: tuple[float | None, float | None]
    predicted_capacity: float | None  # 1 + t_d / t_v, colocated one request at a time
    overlap_bound: float | None  # split / colocated tok/s per device were every replica always busy
    terms_ms_per_token: dict[str, float]  # split-only costs at `clients`
    busy: dict[str, float | None]  # split's roles at `clients`
    batch: tuple[float | None, float | None]  # mean batch (colocated, split) at `clients`
    # a verifier device's ms per token at `clients` (colocated, split): `placement_ledger`
    ledgers: tuple[Ledger | None, Ledger | None] = (None, None)
    level_bound: float | None = None  # `overlap_bound` at the round times `clients` ran


def capacity(rows: Sequence[LoadRow], fraction: float) -> Capacity | None:
    """Capacity of one (placement, method)'s rows (any order) at `fraction` of the lowest
    concurrency's per-client tok/s."""
    rows = sorted(rows, key=lambda r: r.concurrency)
    lowest = rows[0].client_tokens_per_s if rows else None
    if not lowest:
        return None
    floor = fraction * lowest
    passing = [r.concurrency for r in rows if (r.client_tokens_per_s or 0) >= floor]
    return Capacity(max(passing), censored=passing[-1:] == [rows[-1].concurrency],
                    baseline=max(passing) == rows[0].concurrency and len(rows) > 1,
                    floor_tps=floor)


def verdicts(summary: dict[str, dict[str, PlacementRun]], rows: Sequence[LoadRow],
             devices: dict[str, Devices], fraction: float) -> list[Verdict]:
    """A verdict per drafting method for every split placement measured beside colocated."""
    out = []
    for placement in summary:
        if placement in ("colocated", AHEAD) or "colocated" not in summary:
            continue  # split-ahead has its own verdict, against split (`placement_ahead`)
        for method in summary[placement]:
            if method == "ar" or method not in summary["colocated"]:
                continue
            out.append(_verdict(method, placement, summary, rows, devices, fraction))
    return out


def _verdict(method: str, placement: str, summary: dict[str, dict[str, PlacementRun]],
             rows: Sequence[LoadRow], devices: dict[str, Devices], fraction: float) -> Verdict:
    mine = {p: [r for r in rows if r.placement == p and r.method == method]
            for p in ("colocated", placement)}
    levels = sorted({r.concurrency for r in mine[placement]} & {r.concurrency for r in mine["colocated"]})
    clients = GOAL_CLIENTS if GOAL_CLIENTS in levels else max(levels, default=1)
    at = {p: next((r for r in mine[p] if r.concurrency == clients), None) for p in mine}
    caps = _pair(placement, lambda p: capacity(mine[p], fraction))
    per_device_of_verifier = (per_verifier(caps[0], devices, "colocated"),
                              per_verifier(caps[1], devices, placement))
    one = {p: summary[p][method] for p in mine}
    colocated = one["colocated"]
    t_d, t_v = _draft_ms(colocated), colocated.verify_ms_per_round
    split = at[placement]
    return Verdict(
        method=method, placement=placement,
        draft_ms_per_token=_pair(placement, lambda p: _per_token(one[p])),
        clients=clients,
        per_device=_pair(placement, lambda p: _read(at[p], lambda r: r.tokens_per_s_per_device)),
        capacity=caps, capacity_per_verifier=per_device_of_verifier,
        predicted_capacity=1 + t_d / t_v if t_d is not None and t_v else None,
        overlap_bound=overlap_bound(colocated, one[placement], devices[placement]),
        terms_ms_per_token=_terms(one[placement], split),
        busy=split.busy if split is not None else {},
        batch=_pair(placement, lambda p: _read(at[p], lambda r: r.mean_batch)),
        ledgers=_pair(placement, lambda p: ledger(at[p], one[p], devices[p].verifiers,
                                                  p != "colocated")),
        level_bound=level_bound(at["colocated"], split, devices[placement]),
    )


def overlap_bound(colocated: PlacementRun, split: PlacementRun, devices: Devices) -> float | None:
    """Split's tok/s per device over colocated's were every replica busy all the time at the same
    batch (each placement's one-request round times): a colocated device runs a round in
    t_d + t_v; split's rounds go at the pace of its slower role, max(t_d / drafter replicas,
    t_v / verifier replicas), over all its devices."""
    drafters, verifiers = devices.total - devices.verifiers, devices.verifiers
    c_d, s_d = _draft_ms(colocated), _draft_ms(split)
    c_v, s_v = colocated.verify_ms_per_round, split.verify_ms_per_round
    if not (c_d is not None and c_v and s_d and s_v and drafters and verifiers):
        return None
    return (c_d + c_v) / (devices.total * max(s_d / drafters, s_v / verifiers))


_T = TypeVar("_T")


def _read(row: LoadRow | None, value: Callable[[LoadRow], _T | None]) -> _T | None:
    """`value` of `row`; None when `row` is None (the level was not measured)."""
    return None if row is None else value(row)


def _pair(placement: str, value: Callable[[str], _T]) -> tuple[_T, _T]:
    """A verdict's (colocated, split) pair: `value` of "colocated" and of `placement`."""
    return value("colocated"), value(placement)


def per_verifier(c: Capacity | None, devices: dict[str, Devices], placement: str) -> float | None:
    """`placement`'s capacity (clients) per device holding a verifier (None: no capacity)."""
    return None if c is None else c.clients / devices[placement].verifiers


def _draft_ms(row: PlacementRun) -> float | None:
    """t_d: draft + catch-up ms per round, one request at a time."""
    draft = row.draft_ms_per_round
    return None if draft is None else draft + (row.sync_ms_per_round or 0.0)


def _per_token(row: PlacementRun) -> float | None:
    """Draft + catch-up ms per generated token, one request at a time."""
    cost = _draft_ms(row)
    return cost / row.tokens_per_round if cost is not None and row.tokens_per_round else None


def _terms(one: PlacementRun, split: LoadRow | None) -> dict[str, float]:
    """Split-only costs per generated token at the verdict's concurrency (`split`: None when not
    measured there): transport, the drafter's catch-up forward (one request at a time), and the
    verifier's idle time."""
    terms = {"transport": _read(split, lambda r: r.transport_ms_per_token) or 0.0}
    if one.sync_ms_per_round and one.tokens_per_round:
        terms["catch-up"] = one.sync_ms_per_round / one.tokens_per_round
    busy = _read(split, lambda r: r.busy.get("verifier"))
    rate = _read(split, lambda r: r.tokens_per_s)
    if busy is not None and rate:
        terms["verifier idle"] = (1 - busy) * 1e3 / rate
    return terms


def _ratio(pair: tuple[float | None, float | None]) -> float | None:
    a, b = pair
    return b / a if a and b is not None else None


def capacity_gain(v: Verdict) -> tuple[float | None, str]:
    """Split's capacity per verifier device over colocated's, and what it is: "" (measured),
    ">=" / "<=" (a bound: one side passed every level measured), or "unknown" (both did)."""
    return capacity_gain_of(v.capacity, v.capacity_per_verifier)


def capacity_gain_of(caps: tuple[Capacity | None, Capacity | None],
                     per_device: tuple[float | None, float | None]) -> tuple[float | None, str]:
    """`capacity_gain` of (colocated, split) capacities and their capacities per verifier
    device (`per_verifier`)."""
    ratio, (colocated, split) = _ratio(per_device), caps
    if ratio is None or colocated is None or split is None or colocated.baseline or split.baseline:
        return None, "unknown"
    kinds = {(False, False): "", (False, True): ">=", (True, False): "<=", (True, True): "unknown"}
    return ratio, kinds[colocated.censored, split.censored]


def _bounded_goal(gain: tuple[float | None, str], goal: float) -> str:
    value, kind = gain
    if value is None or kind == "unknown":
        return ("undecided (both placements passed every level, or one passed only the lowest: "
                "measure more levels, serving.client_concurrency)")
    if kind == ">=" and value < goal or kind == "<=" and value >= goal:
        return f"undecided ({kind} {value:.2f}x: measure more, serving.client_concurrency)"
    return _goal(value, goal).replace("(", f"({kind} " if kind else "(", 1)


def _gain_words(gain: tuple[float | None, str]) -> str:
    value, kind = gain
    return "unknown" if value is None or kind == "unknown" else f"{kind} {value:.2f}x".strip()


def _cap_words(c: Capacity | None) -> str:
    if c is None:
        return "-"
    return f"{'>= ' if c.censored else ''}{c.clients}{' (only the lowest level)' if c.baseline else ''}"


def _floor_words(c: Capacity | None) -> str:
    return "-" if c is None else f"{c.floor_tps:.1f}"


def sentence(v: Verdict) -> str:
    """The verdict in words: the change, the deciding term, the prediction, the goals."""
    change = _ratio(v.draft_ms_per_token)
    decider = max(v.terms_ms_per_token.items(), key=lambda kv: kv[1], default=("none", 0.0))
    goals = [
        f"both split replicas busy >= {GOAL_BUSY:.0%}: "
        + ("met" if all((f or 0) >= GOAL_BUSY for f in v.busy.values()) and v.busy else "missed")
        + f" ({busy_words(v.busy)})",
        f"tok/s per device >= {GOAL_PER_DEVICE}x colocated: "
        + _goal(_ratio(v.per_device), GOAL_PER_DEVICE),
        f"capacity per verifier device >= {GOAL_CAPACITY}x colocated: "
        + _bounded_goal(capacity_gain(v), GOAL_CAPACITY),
    ]
    return (
        f"**{v.method}, {v.placement}:** drafting costs {fmt_or_dash(v.draft_ms_per_token[1], 2)} ms per "
        f"generated token split against {fmt_or_dash(v.draft_ms_per_token[0], 2)} colocated "
        f"({fmt_or_dash(change, 2)}x, one request at a time). At {v.clients} clients split serves "
        f"{fmt_or_dash(_ratio(v.per_device), 2)}x colocated's tok/s per device ("
        f"{fmt_or_dash(v.overlap_bound, 2)}x if every replica of both were always busy at one request's "
        "round times"
        + (f", {v.level_bound:.2f}x at those this level ran" if v.level_bound is not None else "")
        + "); the largest split-only "
        f"cost is {decider[0]} at {decider[1]:.2f} ms per token (all: "
        + ", ".join(f"{k} {ms:.2f}" for k, ms in v.terms_ms_per_token.items())
        + f"); mean batch {fmt_or_dash(v.batch[1], 1)} split vs {fmt_or_dash(v.batch[0], 1)} colocated. Capacity "
        f"per verifier device, split over colocated: {_gain_words(capacity_gain(v))} (clients "
        f"{_cap_words(v.capacity[1])} split vs {_cap_words(v.capacity[0])} colocated; each client "
        f"kept >= {_floor_words(v.capacity[1])} vs {_floor_words(v.capacity[0])} tok/s), against "
        f"the (1 + t_d / t_v) prediction of {fmt_or_dash(v.predicted_capacity, 2)}x. "
        + _ledger_sentence(v) + "Goals: " + "; ".join(goals) + "."
    )


def _ledger_sentence(v: Verdict) -> str:
    """What split's verifier device lost at the verdict's level, in ms per token ("" when a
    term was not measured)."""
    colocated, split = v.ledgers
    if colocated is None or split is None:
        return ""
    lost = max(losses(split).items(), key=lambda kv: kv[1])
    floors = [c.floor_tps for c in v.capacity if c is not None]
    floor = (f" (a saturated placement's capacity is its tok/s over its floor: this ratio x "
             f"colocated's floor over split's, {floors[0] / floors[1]:.2f})"
             if len(floors) == 2 and floors[1] else "")
    return (f"Per verifier device at {v.clients} clients split serves "
            f"{colocated.wall / split.wall:.2f}x colocated's tok/s{floor}, against "
            f"{colocated.rounds / split.rounds:.2f}x predicted from the round forwards at the "
            f"batches they ran ({colocated.one_request / split.one_request:.2f}x one request at "
            f"a time; {(colocated.rounds + colocated.prefill) / (split.rounds + split.prefill):.2f}x "
            f"with the prefills, which split's verifier runs alone); "
            f"{ledger_words('colocated', colocated)}; {ledger_words('split', split)}; "
            f"split lost most to {lost[0]} ({lost[1]:.1f} ms per token). ")


def _goal(value: float | None, goal: float) -> str:
    if value is None:
        return "not measured"
    return f"{'met' if value >= goal else 'missed'} ({value:.2f}x" + (
        f", short by {goal - value:.2f})" if value < goal else ")")


def verdict_markdown(found: Sequence[Verdict], fraction: float) -> list[str]:
    """The verdict section of placement.md (nothing when no split ran beside colocated)."""
    if not found:
        return []
    rows = [[v.method, v.placement, fmt_or_dash(v.draft_ms_per_token[0], 2), fmt_or_dash(v.draft_ms_per_token[1], 2),
             fmt_or_dash(_ratio(v.per_device), 2), fmt_or_dash(v.overlap_bound, 2), _cap_words(v.capacity[0]),
             _cap_words(v.capacity[1]), _gain_words(capacity_gain(v)),
             fmt_or_dash(v.predicted_capacity, 2)] for v in found]
    header = ["method", "placement", "draft ms/token colocated", "draft ms/token split",
              "split/colocated tok/s per device", "the same, every replica always busy",
              "capacity colocated", "capacity split",
              "capacity per verifier device (x)", "predicted 1 + t_d/t_v"]
    return ["", "## Verdict", "", markdown_table(header, rows), "",
            f"Capacity = the most clients measured that each still got >= {fraction:.0%} of one "
            "client's tok/s (>= : every level passed); it resolves only to the levels measured "
            "(levels 2x apart move the ratio in steps of 2x: add 3, 6, 12 to decide a 1.5x "
            "goal). Draft ms/token = (draft + catch-up) per "
            "round over tokens per round, one request at a time. The prediction uses colocated's "
            "t_d = draft + catch-up and t_v = verify per round; the bound each placement's own: "
            "(t_d + t_v) colocated over devices x max(t_d / drafters, t_v / verifiers) split.", "",
            *[f"- {sentence(v)}" for v in found]]


REPORT_FILE = "placement.json"


class PlacementReport(JsonFile):
    """placement.json: per placement and method one request at a time (`summary`), per client
    concurrency (`concurrency`), the placements skipped and why, notes, each placement's
    devices, the verdicts, whether every placement and method gave the same text, every
    measured request, and drafting ahead's verdicts."""

    model_config = ConfigDict(frozen=True)
    FILE: ClassVar[str] = REPORT_FILE

    summary: dict[str, dict[str, PlacementRun]]
    concurrency: list[LoadRow]
    skipped: dict[str, str]
    notes: list[str]
    devices: dict[str, Devices]
    verdicts: list[Verdict]
    outputs_identical: bool
    requests: list[RequestRecord]
    ahead: list[AheadVerdict] = []  # split drafting ahead against split (`placement_ahead`)


class PlacementSections(BaseModel):
    """What the placement stage records in its manifest.json beside the stage's own keys (which
    this ignores): the counts, the placements measured and skipped, the exactness check, and the
    verdict sentences the main job's report quotes."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    counts: dict[str, int] = {}
    placements: list[str] = []
    skipped: dict[str, str] = {}
    outputs_identical: bool = False
    verdicts: list[str] = []

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> PlacementSections:
        """The sections of a placement manifest (`peftbd.analysis.report.read_stage_manifests`)."""
        return cls.model_validate(manifest)

    def to_sections(self) -> dict[str, Any]:
        """The stage's returned sections (`peftbd.stage.run_stage` merges them into the
        manifest)."""
        return self.model_dump()
