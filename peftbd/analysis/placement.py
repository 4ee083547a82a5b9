"""The placement experiment's report (no Ray): per-request records, the per-placement summary
(transport separated from compute), the greedy-exactness check and the Markdown table."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from peftbd.analysis.tables import markdown_table
from peftbd.serving.schemas import SpecStats


@dataclass
class RequestRecord:
    """One measured request: its output and timings (client wall time and `usage.speculative`);
    `concurrency`: the clients in flight while it ran, `start_s` / `end_s`: when it was sent and
    answered (seconds on the client's clock, for the aggregate wall time of a concurrent run)."""

    placement: str
    method: str
    prompt: int
    text: str
    completion_tokens: int
    wall_ms: float
    spec: SpecStats
    concurrency: int = 1
    start_s: float = 0.0
    end_s: float = 0.0


@dataclass(frozen=True)
class Window:
    """One (placement, method, concurrency) run's replica load: per role (engine | drafter |
    verifier), each replica's busy fraction (its model lock held / the run's wall time)."""

    placement: str
    method: str
    concurrency: int
    busy: dict[str, list[float]]


@dataclass(frozen=True)
class Devices:
    """The devices a placement ran on: all of them, and those holding a verifier."""

    total: int
    verifiers: int


TIMES = ("prefill_ms", "draft_ms", "verify_ms", "sync_ms", "other_ms", "queued_ms", "transport_ms")
"""The `SpecStats` time fields (ms totals) a summary adds up."""


@dataclass(frozen=True)
class PlacementRun:
    """One (placement, method) one request at a time (`summarize`); None: nothing to divide by."""

    requests: int
    completion_tokens: int
    rounds: int
    tokens_per_s: float | None
    tokens_per_round: float | None
    acceptance_rate: float | None
    prefill_ms_per_request: float | None
    draft_ms_per_round: float | None
    verify_ms_per_round: float | None
    sync_ms_per_round: float | None
    other_ms_per_round: float | None
    transport_ms_per_round: float | None
    draft_over_verify: float | None
    transport_share: float | None
    ingress_http_ms_per_request: float | None
    resumes: int
    feature_bytes_per_token: float | None
    queued_ms_per_round: float | None = None


def summarize(records: Sequence[RequestRecord]) -> dict[str, dict[str, PlacementRun]]:
    """Per placement, per method: tokens/s from client wall time, tokens per round, per-round
    draft / verify / sync / other / transport ms, draft cost over verify cost, and the verifier
    feature bytes a split head drafter received per completion token (prefill included)."""
    out: dict[str, dict[str, PlacementRun]] = {}
    key: Callable[[RequestRecord], tuple[str, str]] = (  # noqa: E731
        lambda r: (r.placement, r.method))
    for (placement, method), run in itertools.groupby(sorted(records, key=key), key=key):
        group = list(run)
        rounds = sum(r.spec.rounds for r in group)
        tokens = sum(r.completion_tokens for r in group)
        wall_s = sum(r.wall_ms for r in group) / 1e3
        totals: dict[str, float] = {t: sum(getattr(r.spec, t) for r in group) for t in TIMES}
        replica_ms = sum(totals.values())
        out.setdefault(placement, {})[method] = PlacementRun(
            requests=len(group), completion_tokens=tokens, rounds=rounds,
            tokens_per_s=_div(tokens, wall_s),
            tokens_per_round=_div(tokens - len(group), rounds),  # the prefill token is no round's
            acceptance_rate=_div(sum(r.spec.accepted_tokens for r in group),
                                 sum(r.spec.proposed_tokens for r in group)),
            prefill_ms_per_request=_div(totals["prefill_ms"], len(group)),
            draft_ms_per_round=_div(totals["draft_ms"], rounds),
            verify_ms_per_round=_div(totals["verify_ms"], rounds),
            sync_ms_per_round=_div(totals["sync_ms"], rounds),
            other_ms_per_round=_div(totals["other_ms"], rounds),
            transport_ms_per_round=_div(totals["transport_ms"], rounds),
            draft_over_verify=_div(totals["draft_ms"] + totals["sync_ms"], totals["verify_ms"]),
            transport_share=_div(totals["transport_ms"], wall_s * 1e3),
            ingress_http_ms_per_request=_div(wall_s * 1e3 - replica_ms, len(group)),
            resumes=sum(r.spec.resumes for r in group),
            feature_bytes_per_token=_div(sum(r.spec.feature_bytes for r in group), tokens),
            queued_ms_per_round=_div(totals["queued_ms"], rounds),
        )
    return out


def one_at_a_time(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The records of the lowest concurrency measured (1 normally): what `summarize` reports."""
    low = min((r.concurrency for r in records), default=1)
    return [r for r in records if r.concurrency == low]


@dataclass(frozen=True)
class LoadRow:
    """One (placement, method, client concurrency) run (`concurrency_summary`); None: nothing to
    divide by (`tokens_per_s_per_device`: the placement's devices not given)."""

    placement: str
    method: str
    concurrency: int
    requests: int
    requests_per_s: float | None
    tokens_per_s: float | None
    tokens_per_s_per_device: float | None
    client_tokens_per_s: float | None
    p50_ms: float
    p95_ms: float
    transport_ms_per_token: float | None
    mean_batch: float | None
    busy: dict[str, float | None]  # role: its replicas' mean busy fraction
    speedup: float | None = None
    # the replicas' time per round at this level (a batched call's whole time: t_d and t_v at
    # the batch sizes they ran), and the tokens a round gave
    draft_ms_per_round: float | None = None
    verify_ms_per_round: float | None = None
    sync_ms_per_round: float | None = None
    other_ms_per_round: float | None = None
    tokens_per_round: float | None = None
    # the prefill calls' time per generated token (each call once: a request's over its call's
    # requests)
    prefill_ms_per_token: float | None = None
    rounds_per_request: float | None = None
    pre_drafted: float | None = None  # the share of rounds whose draft was drafted ahead


def concurrency_summary(records: Sequence[RequestRecord], windows: Sequence[Window] = (),
                        devices: dict[str, Devices] | None = None) -> list[LoadRow]:
    """One row per (placement, method, concurrency): requests/s and tokens/s over the run's
    aggregate wall time (first request sent to last answered), tokens/s per device (`devices`),
    each client's tokens/s (mean over requests), p50 / p95 client latency, the transport per
    generated token (each request's share of its batched calls, summed), the mean batch size of
    its rounds, each role's mean replica busy fraction (`windows`), tokens/s over the same
    placement and method at the lowest concurrency (`speedup`), and the draft / verify / sync
    ms and tokens of a round at this level."""
    load = {(w.placement, w.method, w.concurrency): w.busy for w in windows}
    key: Callable[[RequestRecord], tuple[str, str, int]] = (  # noqa: E731
        lambda r: (r.placement, r.method, r.concurrency))
    rows: list[LoadRow] = []
    for (placement, method, conc), run in itertools.groupby(sorted(records, key=key), key=key):
        group = list(run)
        wall_s = max(r.end_s for r in group) - min(r.start_s for r in group)
        tokens = sum(r.completion_tokens for r in group)
        latencies = sorted(r.wall_ms for r in group)
        rounds = sum(r.spec.rounds for r in group)
        rows.append(LoadRow(
            placement=placement, method=method, concurrency=conc,
            requests=len(group), requests_per_s=_div(len(group), wall_s),
            tokens_per_s=_div(tokens, wall_s),
            tokens_per_s_per_device=_div(tokens, wall_s * devices[placement].total)
            if devices and placement in devices else None,
            client_tokens_per_s=_div(sum(r.completion_tokens / r.wall_ms * 1e3 for r in group),
                                     len(group)),
            p50_ms=round(_quantile(latencies, 0.5), 1),
            p95_ms=round(_quantile(latencies, 0.95), 1),
            transport_ms_per_token=_div(sum(r.spec.transport_ms for r in group), tokens),
            mean_batch=_div(sum(r.spec.mean_batch_size * r.spec.rounds for r in group), rounds),
            busy={role: _div(sum(f), len(f))
                  for role, f in load.get((placement, method, conc), {}).items()},
            draft_ms_per_round=_div(sum(r.spec.draft_ms for r in group), rounds),
            verify_ms_per_round=_div(sum(r.spec.verify_ms for r in group), rounds),
            sync_ms_per_round=_div(sum(r.spec.sync_ms for r in group), rounds),
            other_ms_per_round=_div(sum(r.spec.other_ms for r in group), rounds),
            tokens_per_round=_div(tokens - len(group), rounds),  # the prefill token is no round's
            prefill_ms_per_token=_div(sum(r.spec.prefill_ms / max(r.spec.prefill_batch_size, 1)
                                          for r in group), tokens),
            rounds_per_request=_div(rounds, len(group)),
            pre_drafted=_div(sum(r.spec.pre_drafted_rounds for r in group), rounds),
        ))
    base: dict[tuple[str, str], float | None] = {}  # (placement, method): its lowest's tok/s
    for row in rows:  # sorted: the lowest concurrency of each (placement, method) comes first
        base.setdefault((row.placement, row.method), row.tokens_per_s)
    return [replace(row, speedup=_div(row.tokens_per_s or 0.0,
                                      base[row.placement, row.method] or 0.0)) for row in rows]


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of non-empty sorted values."""
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _div(num: float, den: float) -> float | None:
    return round(num / den, 4) if den else None


def outputs_identical(records: Sequence[RequestRecord]) -> bool:
    """Every placement and method gave the same text for each prompt (greedy exactness)."""
    by_prompt: dict[int, set[str]] = {}
    for r in records:
        by_prompt.setdefault(r.prompt, set()).add(r.text)
    return all(len(texts) == 1 for texts in by_prompt.values())


COLUMNS = [
    ("tokens/s", "tokens_per_s"), ("tokens/round", "tokens_per_round"),
    ("draft ms", "draft_ms_per_round"), ("sync ms", "sync_ms_per_round"),
    ("verify ms", "verify_ms_per_round"), ("other ms", "other_ms_per_round"),
    ("queued ms", "queued_ms_per_round"), ("transport ms", "transport_ms_per_round"),
    ("draft/verify cost", "draft_over_verify"),
    ("transport share", "transport_share"), ("shipped bytes/token", "feature_bytes_per_token"),
]


CONCURRENCY_COLUMNS = [
    ("clients", "concurrency"), ("requests", "requests"), ("requests/s", "requests_per_s"),
    ("tokens/s", "tokens_per_s"), ("x vs lowest", "speedup"), ("p50 ms", "p50_ms"),
    ("p95 ms", "p95_ms"), ("transport ms/token", "transport_ms_per_token"),
    ("mean batch", "mean_batch"), ("draft ms/round", "draft_ms_per_round"),
    ("verify ms/round", "verify_ms_per_round"), ("tok/s per device", "tokens_per_s_per_device"),
    ("tok/s per client", "client_tokens_per_s"), ("pre-drafted", "pre_drafted"),
]


def markdown(summary: dict[str, dict[str, PlacementRun]], skipped: dict[str, str],
             notes: Sequence[str], concurrency: Sequence[LoadRow] = ()) -> str:
    """The placement table (one request at a time; ms are per round), the table per client
    concurrency when several were measured, skipped placements and notes."""
    rows = [[placement, method, *(_fmt(getattr(row, k)) for _, k in COLUMNS)]
            for placement, methods in summary.items() for method, row in methods.items()]
    table = markdown_table(["placement", "method", *(c for c, _ in COLUMNS)], rows)
    lines = ["# Placement: colocated vs split draft/verify", "", table, "",
             "Per-round times: draft / verify = the replicas' draft and verify calls; sync = a "
             "split drafter catching its copy of the verifier KV up with the committed tokens "
             "(plus any state rebuild); other = the rest of the replica-side work; queued = a "
             "replica's time waiting (for admission, other requests' prefill chunks, its turn "
             "in the step loop); transport = the ingress's wall time minus all replica-side "
             "time, plus a split Verifier's hops to its Drafter. "
             "draft/verify cost = (draft + sync) / verify. tokens/s uses the client's wall time "
             "(HTTP and ingress included). shipped bytes/token = the verifier state a split "
             "drafter received instead of running a catch-up forward (the head's features, "
             "FastMTP's final hidden states, PEFT-BD's KV: serving.drafter_sync ship) per "
             "completion token, the head's prefill features included; 0 colocated."]
    if concurrency:
        rows = [[r.placement, r.method, *(_fmt(getattr(r, k)) for _, k in CONCURRENCY_COLUMNS),
                 busy_words(r.busy)] for r in concurrency]
        lines += ["", "## Client concurrency", "",
                  markdown_table(["placement", "method", *(c for c, _ in CONCURRENCY_COLUMNS),
                                  "replica busy"], rows), "",
                  "tokens/s and requests/s over each run's wall time (first request sent to "
                  "last answered); p50 / p95 = client latency per request; transport ms/token = "
                  "the requests' shares of their batched calls' transport over the tokens "
                  "generated; mean batch = requests per batched step (colocated) or verify call "
                  "(split) of a round; draft / verify ms/round = a round's batched draft / verify "
                  "call at this level (t_d, t_v at the batch sizes run); x vs lowest = tokens/s over the lowest concurrency's; "
                  "tok/s per device = tokens/s over the placement's devices (replicas); tok/s "
                  "per client = mean over requests of tokens / latency; pre-drafted = the share of "
                  "rounds whose draft was drafted ahead (split-ahead); replica busy = the mean "
                  "share of the run's wall time each role's replicas held their model lock."]
    if skipped:
        lines += ["", "Skipped placements:"] + [f"- {k}: {v}" for k, v in skipped.items()]
    if notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def busy_words(busy: dict[str, float | None]) -> str:
    """"drafter 0.91, verifier 0.62" (roles' mean busy fractions), "-" when not measured."""
    return ", ".join(f"{role} {_fmt(f)}" for role, f in sorted(busy.items())) or "-"


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"  # no digits past its noise
