"""This box's cost model, fitted from a measured placement run's own ledger (placement.json), as
Vidur profiles operators and fits them. Per placement and method: a batched call's measured time
per round against the batch it ran (least squares over the levels: ms = a + b * rows), for the
draft (a split Drafter's: its draft and its catch-up `sync`) and the verify; from the requests
one client at a time, a prefill's ms per prompt token, the engine's own work between rounds
(`other_ms`, held on the device), and what a request's wall time holds beyond all of that: the
ingress's time (colocated's residual) and, split, a remote call's hop per round (split's residual
beyond colocated's, over its rounds). So one client at a time reproduces by construction; the
loaded levels are what validation tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peftbd.analysis.placement import LoadRow, PlacementRun
from peftbd.simulation.shapes import ForwardShape


@dataclass(frozen=True)
class Line:
    """ms = `intercept` + `slope` * rows (rows >= 1)."""

    intercept: float
    slope: float

    def at(self, rows: int) -> float:
        return max(self.intercept + self.slope * rows, 0.0)

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]]) -> Line:
        """Least squares through (rows, ms) points; a flat line where every point has one rows
        value (one client only), and a slope no lower than 0 (a batch never costs less)."""
        if not points:
            raise ValueError("no measured point to fit a cost line to")
        n = len(points)
        mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
        sxx = sum((x - mx) ** 2 for x, _ in points)
        slope = 0.0 if sxx < 1e-9 else max(sum((x - mx) * (y - my) for x, y in points) / sxx, 0.0)
        return cls(my - slope * mx, slope)


@dataclass(frozen=True)
class FittedCost:
    """The `CostModel` of one (placement, method) on this box (see module doc)."""

    name: str
    draft: Line
    verify: Line
    prefill_ms_per_token: float
    hop_per_round_ms: float
    between_rounds_ms: float
    ingress_ms: float

    def forward_ms(self, shape: ForwardShape) -> float:
        if shape.kind == "prefill":
            return self.prefill_ms_per_token * shape.width
        if shape.kind == "draft":
            return self.draft.at(shape.rows)
        return self.verify.at(shape.rows) + self.between_rounds_ms

    def hop_ms(self, payload_bytes: int) -> float:
        return self.hop_per_round_ms

def fit_costs(alone: dict[str, dict[str, PlacementRun]], rows: Sequence[LoadRow],
              prompt_tokens: float, batch_wait_ms: float, source: str) -> dict[tuple[str, str], FittedCost]:
    """{(placement, method): its cost model} of a measured run: `alone` its one-at-a-time
    summary (`peftbd.analysis.placement.summarize`), `rows` its levels (any number of repeats),
    `prompt_tokens` its prompts' mean length, `batch_wait_ms` its serving setting (a request
    alone waits that long for a batch: part of its residual that the simulator adds itself),
    `source` what `name` says the run was."""
    out: dict[tuple[str, str], FittedCost] = {}
    for placement, by_method in alone.items():
        for method, run in by_method.items():
            mine = [r for r in rows if (r.placement, r.method) == (placement, method)]
            if not mine or not run.requests or not run.rounds or not run.tokens_per_s:
                continue
            lines = {k: Line.fit([(r.mean_batch or 1.0, y) for r in mine if (y := _per_round(r, k)) is not None])
                     for k in ("draft", "verify")}
            base = alone.get("colocated", {}).get(method, run)
            ingress = max(_residual_ms(base) - batch_wait_ms, 0.0)
            rounds = run.rounds / run.requests
            hop = max(_residual_ms(run) - _residual_ms(base), 0.0) / rounds if placement != "colocated" else 0.0
            out[placement, method] = FittedCost(
                name=f"fitted: this box, {placement} {method} ({source})",
                draft=lines["draft"], verify=lines["verify"],
                prefill_ms_per_token=(run.prefill_ms_per_request or 0.0) / prompt_tokens,
                hop_per_round_ms=hop, between_rounds_ms=run.other_ms_per_round or 0.0,
                ingress_ms=ingress)
    return out


def _per_round(row: LoadRow, kind: str) -> float | None:
    """A level's measured ms per round of a batched draft (+ its sync) or verify call."""
    if kind == "verify":
        return row.verify_ms_per_round
    return None if row.draft_ms_per_round is None else row.draft_ms_per_round + (row.sync_ms_per_round or 0.0)


def _residual_ms(run: PlacementRun) -> float:
    """A request's wall time one at a time beyond its replica-side compute (prefill, rounds'
    draft, sync, verify and between-rounds work): ingress, and hops to a Drafter."""
    requests, rounds = run.requests, run.rounds / run.requests
    wall = 1e3 * run.completion_tokens / (run.tokens_per_s or 1.0) / requests
    per_round = sum(v or 0.0 for v in (run.draft_ms_per_round, run.sync_ms_per_round,
                                       run.verify_ms_per_round, run.other_ms_per_round))
    return max(wall - (run.prefill_ms_per_request or 0.0) - rounds * per_round, 0.0)
