"""Where a verifier device's time per generated token went at one client level of the placement
experiment, so the verdict can say what split's capacity lost against the (1 + t_d / t_v)
prediction, in ms per token (no Ray).

The devices holding a verifier (colocated Engines, split Verifiers) spend `wall` = their count x
1000 / tokens/s device-ms per generated token: round forwards at the batch sizes they ran
(`rounds`: colocated draft + catch-up + verify, split verify; each batched call's time over the
rows and tokens it served), `prefill` calls (the same work in both placements, but split's
Verifier runs all of it), the rest of their busy time (`other`: shipping state, host work between
forwards) and `idle`. `one_request` is the round forwards' cost per token one request at a time,
so `batching` = rounds - one_request is what batching saved (< 0) or cost (> 0). The prediction
at the measured batches is colocated's `rounds` over split's (at one request it is 1 + t_d /
t_v), and with the prefills (rounds + prefill) each; the measured ratio is colocated's `wall`
over split's.
"""

from __future__ import annotations

from dataclasses import dataclass

from peftbd.analysis.placement import Devices, LoadRow, PlacementRun


@dataclass(frozen=True)
class Ledger:
    """A verifier device's ms per generated token at one level (module doc); `batch`: the mean
    rows of its round calls."""

    wall: float
    rounds: float
    one_request: float
    prefill: float
    other: float
    idle: float
    batch: float

    @property
    def batching(self) -> float:
        """Round forwards per token at the batches run minus one request at a time."""
        return self.rounds - self.one_request


def ledger(row: LoadRow | None, one: PlacementRun, verifiers: int, split: bool) -> Ledger | None:
    """`row`'s ledger (`one`: the same placement and method one request at a time; `split`:
    the verifier runs no draft); None when a term was not measured."""
    if row is None or not (row.tokens_per_s and row.tokens_per_round and row.mean_batch
                           and one.tokens_per_round):
        return None
    busy = row.busy.get("verifier" if split else "engine")
    if (busy is None or row.verify_ms_per_round is None or one.verify_ms_per_round is None
            or row.prefill_ms_per_token is None):
        return None

    def forwards(draft: float | None, sync: float | None, verify: float) -> float:
        return verify if split else (draft or 0.0) + (sync or 0.0) + verify

    wall = verifiers * 1e3 / row.tokens_per_s
    rounds = forwards(row.draft_ms_per_round, row.sync_ms_per_round, row.verify_ms_per_round) / (
        row.mean_batch * row.tokens_per_round)
    one_request = forwards(one.draft_ms_per_round, one.sync_ms_per_round,
                           one.verify_ms_per_round) / one.tokens_per_round
    prefill = row.prefill_ms_per_token
    return Ledger(wall=wall, rounds=rounds, one_request=one_request, prefill=prefill,
                  other=busy * wall - rounds - prefill, idle=(1 - busy) * wall,
                  batch=row.mean_batch)


def losses(split: Ledger) -> dict[str, float]:
    """Split's verifier ms per token beyond its round forwards one request at a time: what the
    (1 + t_d / t_v) prediction leaves out."""
    return {"prefill": split.prefill, "idle": split.idle, "other busy": split.other,
            "batching": split.batching}


def ledger_words(name: str, led: Ledger) -> str:
    """"split: 160 ms per token = round forwards 120 at batch 5.8 (one request at a time 140,
    batching -20) + prefill 10 + other busy 5 + idle 25"."""
    return (f"{name}: {led.wall:.1f} ms per token = round forwards {led.rounds:.1f} at batch "
            f"{led.batch:.1f} (one request at a time {led.one_request:.1f}, batching "
            f"{led.batching:+.1f}) + prefill {led.prefill:.1f} + other busy {led.other:.1f} + "
            f"idle {led.idle:.1f}")


def level_bound(colocated: LoadRow | None, split: LoadRow | None, devices: Devices) -> float | None:
    """Split's tok/s per device over colocated's were every replica always busy at the round
    times and batches this level ran (the verdict's `overlap_bound` at one request's): a
    colocated device serves its batch's tokens per draft + catch-up + verify; split serves its
    batch's per the slower role's call, max((draft + catch-up) / drafters, verify / verifiers),
    over all its devices."""
    drafters, verifiers = devices.total - devices.verifiers, devices.verifiers
    c = _pace(colocated)
    s = _pace(split)
    if c is None or s is None or not (drafters and verifiers):
        return None
    (c_tokens, c_draft, c_verify), (s_tokens, s_draft, s_verify) = c, s
    per_split = s_tokens / (devices.total * max(s_draft / drafters, s_verify / verifiers))
    return per_split / (c_tokens / (c_draft + c_verify))


def _pace(row: LoadRow | None) -> tuple[float, float, float] | None:
    """(tokens a round's call serves, its draft + catch-up ms, its verify ms) at a level."""
    if row is None or not (row.mean_batch and row.tokens_per_round and row.verify_ms_per_round):
        return None
    if row.draft_ms_per_round is None:
        return None
    return (row.mean_batch * row.tokens_per_round,
            row.draft_ms_per_round + (row.sync_ms_per_round or 0.0), row.verify_ms_per_round)
