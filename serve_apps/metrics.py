"""Per-round Prometheus histograms and counters, recorded by the ingress for both apps.

Exported by Ray as `ray_peftbd_<name>_bucket|_sum|_count` (histograms) and
`ray_peftbd_<name>_total` (counters) with tags `placement` (colocated | split), `method` (a
`serving.synthetic` method's reads "<method> [synthetic: N/round]"), `temperature` (its band:
0 = greedy, (0,0.5], (0.5,1], (1,2]: acceptance per band), for the
per-position counters `position` (1-based), and Serve's own `deployment`, `replica`,
`application`; `serve_apps/grafana_dashboard.json` plots them. Histograms give the quantiles only:
Ray derives a histogram's `_sum` from bucket midpoints, so means come from exact counters,
`peftbd_rounds` and one `peftbd_round_<quantity>` sum per histogram (mean draft ms per round =
round_draft_ms / rounds). A counter only exists once it was incremented by more than 0 (Ray's
rule), so a quantity that stayed 0 has no series: the dashboard reads it as 0. Acceptance rate at
position j = accepted_per_position / proposed_per_position of `position="j"`. Feature bytes (the
verifier state a split drafter is shipped instead of running the verifier, `Method.ships`; 0, so
no series, for ar, colocated and unshipped methods): `peftbd_round_feature_bytes` (what each round's
propose carried: a request's first also every prompt position's). Batching:
`peftbd_batch_size` (the requests a round's batched step carried) and its exact sum `peftbd_round_batch_size` (mean batch = sum / rounds).
"""

from __future__ import annotations

from typing import cast

from ray.serve.metrics import Counter, Histogram

from peftbd.serving.rounds import RoundEvent, temperature_band

MS_BUCKETS: list[float] = [0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
TOKEN_BUCKETS: list[float] = [1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 17]
BATCH_BUCKETS: list[float] = [1, 2, 4, 8, 16, 32, 64]
TAGS = ("placement", "method", "temperature")  # temperature: its band (`temperature_band`)
POSITION_TAGS = (*TAGS, "position")

HISTOGRAMS: dict[str, tuple[str, list[float]]] = {
    "peftbd_draft_ms": ("Drafter-side draft time per round (ms)", MS_BUCKETS),
    "peftbd_verify_ms": ("Verifier-side verify time per round (ms)", MS_BUCKETS),
    "peftbd_sync_ms": ("State sync / rebuild time per round (ms)", MS_BUCKETS),
    "peftbd_transport_ms": ("Ingress wall time per round minus replica-side time (ms)", MS_BUCKETS),
    "peftbd_tokens_per_round": ("Tokens committed per speculative round", TOKEN_BUCKETS),
    "peftbd_batch_size": ("Requests in the batched step / verify call of a round", BATCH_BUCKETS),
}

SUMS = {
    "peftbd_round_draft_ms": ("Sum of the draft ms of the rounds (exact)", "peftbd_draft_ms"),
    "peftbd_round_verify_ms": ("Sum of the verify ms of the rounds (exact)", "peftbd_verify_ms"),
    "peftbd_round_sync_ms": ("Sum of the sync ms of the rounds (exact)", "peftbd_sync_ms"),
    "peftbd_round_transport_ms": (
        "Sum of the transport ms of the rounds (exact)", "peftbd_transport_ms"),
    "peftbd_round_tokens": ("Tokens committed by the rounds (exact)", "peftbd_tokens_per_round"),
    "peftbd_round_batch_size": (
        "Sum of the batch sizes of the rounds (exact; / rounds = mean batch)", "peftbd_batch_size"),
}
"""Exact sums beside the histograms: counter name -> (description, the histogram it sums)."""

COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "peftbd_rounds": ("Speculative rounds (the prefill step excluded)", TAGS),
    **{name: (desc, TAGS) for name, (desc, _) in SUMS.items()},
    "peftbd_session_resumes": ("Request states rebuilt from committed tokens", TAGS),
    "peftbd_round_feature_bytes": (
        "Verifier feature bytes sent to the split drafter by the rounds (exact)", TAGS),
    "peftbd_proposed_per_position": (
        "Speculative rounds whose draft had a token at `position` (1-based)", POSITION_TAGS),
    "peftbd_accepted_per_position": (
        "Speculative rounds whose accepted prefix reached `position` (1-based)", POSITION_TAGS),
}


class RoundMetrics:
    """The histograms and counters, for one app (`placement`)."""

    def __init__(self, placement: str) -> None:
        self.placement = placement
        self.hist = {
            name: Histogram(name, description=desc, boundaries=bounds, tag_keys=_tag_keys(TAGS))
            for name, (desc, bounds) in HISTOGRAMS.items()
        }
        self.counters = {
            name: Counter(name, description=desc, tag_keys=_tag_keys(keys))
            for name, (desc, keys) in COUNTERS.items()
        }

    def observe(self, event: RoundEvent, method: str, temperature: float = 0.0) -> None:
        """Record one step (the prefill step only counts its resumes) of a request of `method`
        sampled at `temperature` (0: greedy)."""
        tags = {"placement": self.placement, "method": method,
                "temperature": temperature_band(temperature)}
        if event.resumes:
            self.counters["peftbd_session_resumes"].inc(event.resumes, tags=tags)
        if event.prefill:
            return
        if event.feature_bytes:  # Ray's counters take increments > 0 only
            self.counters["peftbd_round_feature_bytes"].inc(event.feature_bytes, tags=tags)
        values = {
            "peftbd_draft_ms": event.draft_ms, "peftbd_verify_ms": event.verify_ms,
            "peftbd_sync_ms": event.sync_ms, "peftbd_transport_ms": event.transport_ms,
            "peftbd_tokens_per_round": len(event.tokens), "peftbd_batch_size": event.batch_size,
        }
        for name, value in values.items():
            self.hist[name].observe(value, tags=tags)
        self.counters["peftbd_rounds"].inc(tags=tags)
        for name, (_, hist) in SUMS.items():
            if values[hist] > 0:  # Ray's counters take increments > 0 only
                self.counters[name].inc(values[hist], tags=tags)
        for name, positions in zip(("peftbd_proposed_per_position", "peftbd_accepted_per_position"),
                                   event.positions()):
            for j in positions:
                self.counters[name].inc(tags={**tags, "position": str(j)})


def _tag_keys(keys: tuple[str, ...]) -> tuple[str]:
    """`keys` as `ray.serve.metrics` annotates `tag_keys` (`Tuple[str]`, though it takes any
    number of keys and `ray.util.metrics` says `Tuple[str, ...]`)."""
    return cast("tuple[str]", keys)
