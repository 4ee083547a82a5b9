"""The speculative cost model and the paper's draft-cost oracle (Appendix 8.7).

A round takes T0 seconds of which a share rho is drafting and emits tau tokens (accepted drafts
plus the bonus). Cutting the draft cost by a fraction r gives T(r) = T0 (1 - r rho) and a
throughput of tau / T(r), holding verification, overhead and acceptance fixed (optimistic). The
accepted length needed to reach a target throughput S with free drafting (r = 1) is S * T(1).

A leaf module (it imports nothing from peftbd): the benchmark fills each arm's oracle with it,
the engine speed check and `python -m peftbd.oracle` use it too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

REDUCTIONS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


def iteration_time(t0_s: float, draft_share: float, r: float) -> float:
    """T(r) = T0 (1 - r * draft_share): round time with the draft cost cut by fraction r."""
    return t0_s * (1.0 - r * draft_share)


def draft_cost_oracle(t0_s: float, draft_share: float, accepted: float,
                      targets: Mapping[str, float] | None = None,
                      reductions: Sequence[float] = REDUCTIONS) -> dict[str, Any]:
    """Throughput at each draft-cost reduction and the accepted length each target needs at r = 1.

    Returns {"t0_s", "draft_share", "accepted", "reductions": [{"r", "t_s", "tokens_per_s"}],
    "needed_accepted": {target name: tokens per round}} (the benchmark's `oracle` field).
    """
    if t0_s <= 0:
        raise ValueError(f"t0_s={t0_s}: the measured round time T0 must be > 0 seconds")
    if not 0.0 <= draft_share < 1.0:
        raise ValueError(f"draft_share={draft_share}: the draft cost share must be in [0, 1)")
    if accepted <= 0:
        raise ValueError(f"accepted={accepted}: accepted tokens per round must be > 0")
    for name, tps in (targets or {}).items():
        if tps <= 0:
            raise ValueError(f"target {name!r}={tps}: a target throughput must be > 0 tokens/s")
    free = iteration_time(t0_s, draft_share, 1.0)
    return {
        "t0_s": t0_s,
        "draft_share": draft_share,
        "accepted": accepted,
        "reductions": [
            {"r": r, "t_s": iteration_time(t0_s, draft_share, r),
             "tokens_per_s": accepted / iteration_time(t0_s, draft_share, r)}
            for r in reductions
        ],
        "needed_accepted": {name: tps * free for name, tps in (targets or {}).items()},
    }


def oracle_from_metrics(metrics: Mapping[str, Any], targets: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The oracle for a measured run (`peftbd.decoding.summarize` output)."""
    return draft_cost_oracle(metrics["round"]["t0_s"], metrics["round"]["draft_share"],
                             metrics["mean_accepted"], targets)


def oracle_table(oracle: Mapping[str, Any]) -> str:
    """Plain-text table of an oracle result."""
    lines = [
        f"T0 = {oracle['t0_s']:.4f} s/round, draft share = {oracle['draft_share']:.3f}, "
        f"accepted = {oracle['accepted']:.3f} tokens/round",
        "",
        f"{'r':>6}  {'T(r) s':>9}  {'tokens/s':>9}",
    ]
    lines += [f"{red['r']:>6.2f}  {red['t_s']:>9.4f}  {red['tokens_per_s']:>9.3f}"
              for red in oracle["reductions"]]
    if oracle["needed_accepted"]:
        lines += ["", f"{'target':>12}  {'needed accepted at r=1':>22}"]
        lines += [f"{name:>12}  {need:>22.3f}" for name, need in oracle["needed_accepted"].items()]
    return "\n".join(lines)
