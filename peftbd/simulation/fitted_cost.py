"""This box's cost model, fitted from a measured placement run's own ledger (placement.json), as
Vidur fits profiled operators: a batched call's time against the rows it ran (least squares over
the levels: ms = a + b * rows, for the draft, with a split Drafter's catch-up `sync`, and the
verify), scaled at each level to that level's own measured call times, since on this box the
replicas share two cores and a call costs what it costs among that level's neighbours; a
prefill's ms per prompt token; a remote call's hop per round and the ingress's time per request,
from the level's measured transport. So the fitted model carries the box's contention as
measured, and what validation tests is the rest: the scheduler, the step loop's decisions and
the queueing of requests on the devices."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peftbd.analysis.placement import LoadRow
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

def fit_costs(rows: Sequence[LoadRow], prompt_tokens: float, source: str
              ) -> dict[tuple[str, str, int], FittedCost]:
    """{(placement, method, clients): its cost model} of a measured run's levels (`rows`, any
    number of repeats; `prompt_tokens` its prompts' mean length, `source` what `name` says the
    run was): the batch shape of each call (`Line`, fitted over all levels) scaled to the level's
    own measured call times (on this box the replicas share two cores, so a call at one level
    costs what it cost among that level's neighbours); its prefill per prompt token; its hop
    per round (split's transport per round beyond colocated's at the same level: the remote
    call); its ingress time per request (colocated's transport per request at that level: the
    ingress's wall time beyond the replica's)."""
    by_key: dict[tuple[str, str, int], list[LoadRow]] = {}
    for r in rows:
        by_key.setdefault((r.placement, r.method, r.concurrency), []).append(r)
    shape = {(p, m): {k: Line.fit([(r.mean_batch or 1.0, y) for r in rows if (r.placement, r.method) == (p, m)
                                   and (y := _per_round(r, k)) is not None] or [(1.0, 0.0)])
                      for k in ("draft", "verify")}
             for p, m, _ in by_key}
    out: dict[tuple[str, str, int], FittedCost] = {}
    for (placement, method, clients), level in by_key.items():
        colocated = by_key.get(("colocated", method, clients), level)
        ingress = _mean([_transport_per_round(r) * (r.rounds_per_request or 0.0) for r in colocated])
        hop = _mean([_transport_per_round(r) for r in level]) - _mean([_transport_per_round(r) for r in colocated])
        batch = _mean([r.mean_batch or 1.0 for r in level])
        lines = {k: _scaled(line, batch, _mean([y for r in level if (y := _per_round(r, k)) is not None]))
                 for k, line in shape[placement, method].items()}
        out[placement, method, clients] = FittedCost(
            name=f"fitted: this box ({source})", draft=lines["draft"], verify=lines["verify"],
            prefill_ms_per_token=_mean([(r.prefill_ms_per_token or 0.0) * (r.tokens_per_round or 1.0)
                                        * (r.rounds_per_request or 0.0) for r in level]) / prompt_tokens,
            hop_per_round_ms=max(hop, 0.0), between_rounds_ms=0.0, ingress_ms=ingress)
    return out


def _per_round(row: LoadRow, kind: str) -> float | None:
    """A level's measured ms per round of a batched draft (+ its sync) or verify call."""
    if kind == "verify":
        return row.verify_ms_per_round
    return None if row.draft_ms_per_round is None else row.draft_ms_per_round + (row.sync_ms_per_round or 0.0)


def _transport_per_round(row: LoadRow) -> float:
    return (row.transport_ms_per_token or 0.0) * (row.tokens_per_round or 1.0)


def _scaled(line: Line, batch: float, measured: float) -> Line:
    """`line` scaled to cost `measured` at `batch` rows."""
    at = line.intercept + line.slope * batch
    k = measured / at if at > 0 else 1.0
    return Line(line.intercept * k, line.slope * k)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
