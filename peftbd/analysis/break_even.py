"""The paper's question at its own acceptance: each arm's speedup over greedy AR as a function of
accepted tokens per round, under every round cost this run has.

speedup(a) = a * AR step / round, a round's time (draft + verify, + host where measured whole)
from one cost source: this run's rounds (tiny, measured), one engine-timed round at the paper's
architecture on this hardware (the cost profile), whole decodes there under synthetic acceptance
(`peftbd.benchmarking.shape_decode`), and the roofline of one GPU. Break-even = round / AR step.
The reference acceptance of an arm is its synthetic arm's target (`decoding.synthetic`: the
paper's 2.881 for PEFT-BD, 1.511 for FastMTP) or else the paper's number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from peftbd.analysis.paper import ORACLE, PAPER_AR, PAPER_PEFTBD, PAPER_VALUES, SGLANG, paper_value
from peftbd.analysis.tables import fmt, markdown_table
from peftbd.benchmarking.schema import Results
from peftbd.methods.arm import AR
from peftbd.methods.peft_bd import ID as PEFTBD

SYNTHETIC = "_synthetic"


PAPER_ROUND_MS = 1e3 * paper_value("t0_s", PAPER_PEFTBD, ORACLE).number
PAPER_AR_MS = 1e3 / paper_value("tokens_per_s", PAPER_AR).number


@dataclass(frozen=True)
class CostSource:
    """Round times (ms) of AR and of each speculative arm (by its real arm id) from one source:
    this run's rounds, the profile's one round, its measured decode, or the roofline (`kind`)."""

    kind: Literal["run", "round", "decode", "roofline"]
    name: str
    ar_ms: float
    round_ms: dict[str, float]

    def speedup(self, arm: str, accepted: float) -> float:
        return accepted * self.ar_ms / self.round_ms[arm]

    def break_even(self, arm: str) -> float:
        return self.round_ms[arm] / self.ar_ms


def base_arm(arm_id: str) -> str:
    """A synthetic arm's real arm id (its own id otherwise)."""
    return arm_id.removesuffix(SYNTHETIC)


def cost_sources(results: Results) -> list[CostSource]:
    """Every round cost this run has, cheapest evidence last: the roofline."""
    arms, sources = results.arms, []
    if AR in arms:
        sources.append(CostSource(
            "run", f"this run ({results.measured_on.model}), measured",
            1e3 * arms[AR].round.t0_s,
            {a: 1e3 * v.round.t0_s for a, v in arms.items()
             if v.speculative and not a.endswith(SYNTHETIC)}))
    prof = results.cost_at_scale
    if prof is None:
        return sources
    name, dtype = prof.architecture.name, prof.primary_dtype
    costs = prof.profiles[dtype].arms
    sources.append(CostSource(
        "round", f"{name} {dtype}, one round, {prof.hardware}", costs[AR].verify_ms_round,
        {a: c.draft_ms_round + c.verify_ms_round for a, c in costs.items()
         if c.method != AR and not a.endswith(SYNTHETIC)}))
    if prof.decode is not None:
        whole = {a: d.draft_ms_round + d.verify_ms_round + d.host_ms_round
                 for a, d in prof.decode.arms.items()}
        sources.append(CostSource(
            "decode",
            f"{name} {prof.decode.dtype}, decoded (synthetic acceptance), {prof.hardware}",
            whole.pop(AR), {base_arm(a): ms for a, ms in whole.items()}))
    roof = prof.roofline.arms
    sources.append(CostSource(
        "roofline", f"{name} bf16, {prof.roofline.gpu.name} roofline",
        roof[AR].roofline_verify_ms,
        {a: w.roofline_draft_ms + w.roofline_verify_ms for a, w in roof.items()
         if w.draft_forwards and not a.endswith(SYNTHETIC)}))
    return sources


def reference_acceptance(results: Results) -> dict[str, tuple[float, str]]:
    """{real arm id: (accepted tokens per round, where it comes from)}: the synthetic arm's
    target, else the paper's (SGLang) number."""
    out = {pv.arm: (pv.value, "the paper") for pv in PAPER_VALUES
           if pv.metric == "mean_accepted" and pv.measured_on == SGLANG and pv.arm in results.arms
           and pv.value is not None}
    for arm_id, arm in results.arms.items():
        target = arm.settings.get("synthetic")
        if target is not None:
            source = "the paper" if out.get(base_arm(arm_id), (None,))[0] == target else "synthetic"
            out[base_arm(arm_id)] = (target, source)
    return out


@dataclass(frozen=True)
class Row:
    arm: str
    label: str
    source: str
    accepted: float  # this run's
    reference: float | None
    break_even: float
    speedup_here: float
    speedup_at_reference: float | None


def rows(results: Results) -> list[Row]:
    """One row per (arm with a reference acceptance, cost source that priced it)."""
    refs, out = reference_acceptance(results), []
    for arm, (ref, _) in refs.items():
        accepted = results.arms[arm].mean_accepted.mean
        for src in cost_sources(results):
            if arm in src.round_ms:
                out.append(Row(arm, results.arms[arm].label, src.name, accepted, ref,
                               src.break_even(arm), src.speedup(arm, accepted),
                               src.speedup(arm, ref)))
    return out


def table(results: Results) -> str | None:
    """The paper's question, per arm and cost source (None: no arm has a reference)."""
    found = rows(results)
    if not found:
        return None
    refs = reference_acceptance(results)
    header = ["arm", "round cost from", "break-even accepted/round", "accepted/round here",
              "speedup vs AR here", "reference accepted/round", "speedup vs AR at reference"]
    return markdown_table(header, [
        [r.label, r.source, fmt(r.break_even), fmt(r.accepted), fmt(r.speedup_here),
         f"{fmt(r.reference)} ({refs[r.arm][1]})", fmt(r.speedup_at_reference)] for r in found])


def verdict(results: Results) -> list[str]:
    """The computed answer: does the paper's batch-1 conclusion (PEFT-BD slower than AR) hold at
    its own acceptance, at the roofline and as measured here; and the per-round overhead under
    which PEFT-BD would beat AR there. Empty without the roofline or the PEFT-BD arm."""
    sources = cost_sources(results)
    roof = next((s for s in sources if s.kind == "roofline"), None)
    ref = reference_acceptance(results).get(PEFTBD)
    if roof is None or ref is None or PEFTBD not in roof.round_ms:
        return []
    a = ref[0]
    s, b = roof.speedup(PEFTBD, a), roof.break_even(PEFTBD)
    lines = [
        f"At the paper's own acceptance ({a:g} tokens per round), PEFT-BD at the {roof.name} "
        f"would run **{s:.2f}x** greedy AR (break-even {b:.2f} tokens per round): the paper's "
        f"batch-1 conclusion that PEFT-BD is slower than AR "
        f"**{'does not survive' if s > 1 else 'survives'}** at the roofline.",
        f"PEFT-BD beats AR at {a:g} tokens per round while a round's overhead above its roofline "
        f"({roof.round_ms[PEFTBD]:.3f} ms) stays under **{a * roof.ar_ms - roof.round_ms[PEFTBD]:.3f} ms** "
        f"against an AR step at the roofline ({roof.ar_ms:.3f} ms), or under "
        f"**{a * PAPER_AR_MS - roof.round_ms[PEFTBD]:.2f} ms** against the paper's SGLang AR "
        f"({PAPER_AR_MS:.2f} ms a token); the paper's PEFT-BD round took {PAPER_ROUND_MS:.1f} ms.",
    ]
    decoded = next((x for x in sources if x.kind == "decode"), None)
    if decoded is not None and PEFTBD in decoded.round_ms:
        ds = decoded.speedup(PEFTBD, a)
        lines.append(f"Measured whole decodes at {decoded.name}: PEFT-BD's rounds at {a:g} tokens "
                     f"would run {ds:.2f}x AR (break-even {decoded.break_even(PEFTBD):.2f}).")
    return lines
