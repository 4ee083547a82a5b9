"""Cost at the paper's architecture x acceptance from the tiny run: the report's projection.

`results.cost_at_scale` is the cost profile (`cost_profile.json`, types in
`peftbd.benchmarking.cost_profile_schema`) the benchmark read from its upstream stage. A projected
throughput combines an arm's round cost measured there (draft + verify ms per round, at one dtype,
or the roofline bound of a named GPU) with the accepted tokens per round measured here:
tok/s = accepted / (draft + verify) per round; AR's round is its step. It is labelled as what it
is everywhere: cost at scale x acceptance from the tiny run, not a measured throughput.
"""

from __future__ import annotations

from dataclasses import dataclass

from peftbd.analysis.tables import fmt, markdown_table
from peftbd.benchmarking.forward_paths import fell_back_line, ran_words
from peftbd.benchmarking.schema import Results
from peftbd.methods.arm import AR

LABEL = "cost at scale x acceptance from tiny"


@dataclass(frozen=True)
class Projection:
    """One arm at scale: its measured round cost there and the projected throughput."""

    arm: str
    label: str
    accepted: float  # tokens per round, measured on this (tiny) run
    draft_over_verify: float  # per round, at the profile's primary dtype
    tokens_per_s: float  # projected: accepted / round time at that dtype
    speedup: float  # vs AR's projected (1 / AR step)
    roofline_draft_over_verify: float
    roofline_speedup: float  # the same projection with the roofline round times


def projections(results: Results) -> list[Projection]:
    """Every arm both the profile and this run measured, in the profile's order."""
    prof = results.cost_at_scale
    if prof is None or AR not in results.arms:
        return []
    costs, work = prof.profiles[prof.primary_dtype].arms, prof.roofline.arms

    def round_ms(arm: str) -> float:
        return costs[arm].draft_ms_round + costs[arm].verify_ms_round

    def roof_ms(arm: str) -> float:
        return work[arm].roofline_draft_ms + work[arm].roofline_verify_ms

    rows = []
    for arm, cost in costs.items():
        ours = results.arms.get(arm)
        if ours is None or arm not in work:
            continue
        accepted = ours.mean_accepted.mean
        tps = 1e3 * accepted / round_ms(arm)
        rows.append(Projection(
            arm=arm, label=ours.label, accepted=accepted,
            draft_over_verify=cost.draft_over_verify_round, tokens_per_s=tps,
            speedup=tps / (1e3 / round_ms(AR)),
            roofline_draft_over_verify=work[arm].roofline_draft_over_verify,
            roofline_speedup=(accepted / roof_ms(arm)) / (1 / roof_ms(AR)),
        ))
    return rows


def at_scale_ratio(results: Results, arm: str) -> tuple[str, float] | None:
    """(dtype, draft/verify per round) of `arm` at the profile's primary dtype, if profiled."""
    prof = results.cost_at_scale
    if prof is None:
        return None
    dtype = prof.primary_dtype
    cost = prof.profiles[dtype].arms.get(arm)
    return None if cost is None else (dtype, cost.draft_over_verify_round)


def projected(results: Results, arm: str) -> Projection | None:
    return next((p for p in projections(results) if p.arm == arm), None)


def describe(results: Results) -> str:
    """The paragraph above the table: what was profiled, where and how (what ran: the dtypes,
    device and forward paths, loudly any arm that ran without CUDA graphs)."""
    prof = results.cost_at_scale
    if prof is None:
        return ("Not profiled: this benchmark ran without a cost profile (run "
                "`python -m jobs.cost_profile`, then rerun the benchmark; the main job does both).")
    a, gpu = prof.architecture, prof.roofline.gpu
    return (f"One round of every arm timed by the engine at **{a.name}** ({a.layers} layers, "
            f"hidden {a.hidden_size}, vocabulary {a.vocab_size}, {a.parameters / 1e6:.1f}M "
            f"parameters, {a.origin}, weights {a.weights}), {prof.kv_len} tokens of KV, "
            f"{prof.hardware} ({ran_words(prof.timed_arms())}), median of {prof.repeats} "
            f"rounds per arm, drafters untrained "
            f"(cost does not depend on weights). Draft/verify = a round's draft ms over its "
            f"verify ms (AR: its step). Projected tok/s and speedup vs AR = **{LABEL}**: accepted "
            f"tokens per round measured on this run over the round time at scale "
            f"({prof.primary_dtype}). Roofline: each forward at max(bytes / "
            f"{gpu.hbm_bytes_per_s / 1e12:.2f} TB/s, FLOPs / {gpu.bf16_flops_per_s / 1e12:.0f} "
            f"TFLOPS) on one {gpu.name} in bf16, bytes and FLOPs counted from the engine's own "
            f"forwards. Mask row (adapter-on embedding + LM head over one draft chunk): "
            + "; ".join(f"{d}: peft's wrappers {p.mask_row.peft_wrappers_ms:.1f} ms vs the "
                        f"engine's copy-free path {p.mask_row.engine_ms:.1f} ms"
                        for d, p in prof.profiles.items()) + "."
            + (f" **{line}**." if (line := fell_back_line(prof.timed_arms(), "times")) else ""))


def cost_table(results: Results) -> str | None:
    """Per arm: draft and verify ms per round at each profiled dtype, draft/verify, roofline
    draft/verify, accepted from this run, projected tok/s and speedups; None without a profile."""
    prof = results.cost_at_scale
    if prof is None:
        return None
    dtypes = list(prof.profiles)
    proj = {p.arm: p for p in projections(results)}
    header = ["arm"] + [f"{d} draft / verify ms (ratio)" for d in dtypes] + [
        f"roofline {prof.roofline.gpu.name} draft/verify", "accepted/round (tiny)",
        f"tok/s ({dtypes[0]}, projected)", "speedup vs AR (projected)",
        "speedup vs AR (roofline, projected)"]
    rows = []
    for arm, cost in prof.profiles[dtypes[0]].arms.items():
        ours = results.arms.get(arm)
        cells: list[str | None] = [cost.label if ours is None else ours.label]
        for d in dtypes:
            c = prof.profiles[d].arms[arm]
            cells.append(f"{c.draft_ms_round:.1f} / {c.verify_ms_round:.1f} "
                         f"({c.draft_over_verify_round:.2f})")
        p = proj.get(arm)
        cells += [fmt(prof.roofline.arms[arm].roofline_draft_over_verify),
                  *([fmt(p.accepted), fmt(p.tokens_per_s, 1), fmt(p.speedup),
                     fmt(p.roofline_speedup)] if p else [None] * 4)]
        rows.append(cells)
    return markdown_table(header, rows)


def describe_decode(results: Results) -> str | None:
    """The paragraph above the measured-decode table; None when the profile decoded nothing."""
    prof = results.cost_at_scale
    if prof is None or prof.decode is None:
        return None
    dec, floor = prof.decode, prof.decode.floor
    return (f"Whole requests decoded at **{prof.architecture.name}**'s shape "
            f"({ran_words(dec.arms)}, {prof.hardware}, random weights): {dec.prompts} random prompts of "
            f"{dec.prompt_len} tokens, {dec.max_new_tokens} new tokens each, AR and every "
            f"**SYNTHETIC** arm (its drafter's real forwards, the accepted length forced to the "
            f"target per round with greedy AR's tokens, seed {dec.seed}; verification real, "
            f"outputs checked against AR's). Measured, not projected. Floor of a forward on this "
            f"device = max(bytes / {floor.bytes_per_s / 1e9:.1f} GB/s, FLOPs / "
            f"{floor.flops_per_s / 1e9:.0f} GFLOP/s) ({floor.source}); x over floor = "
            f"measured / floor: near 1 the time is the algorithm's, far above it the stack's. "
            f"Host = the rest of a round (the engine's own work between forwards).")


def decode_table(results: Results) -> str | None:
    """Per arm of the measured decode: target and decoded acceptance, tok/s, speedup, exactness,
    per-round draft / verify / host ms and x over this device's floor."""
    prof = results.cost_at_scale
    if prof is None or prof.decode is None:
        return None
    header = ["arm", "target accepted/round", "decoded accepted/round", "tok/s",
              "speedup vs AR (measured)", "exact", "draft / verify / host ms per round",
              "draft x over floor", "verify forward ms (floor)", "verify x over floor"]
    rows = []
    for a in prof.decode.arms.values():
        draft = "-" if a.draft_ms_forward is None else f"{a.draft_ms_round:.1f}"
        rows.append([a.label, fmt(a.synthetic), fmt(a.mean_accepted),
                     fmt(a.tokens_per_s, 1), fmt(a.speedup_vs_ar),
                     "yes" if a.exact else "**NO**",
                     f"{draft} / {a.verify_ms_round:.1f} / {a.host_ms_round:.1f}",
                     fmt(a.draft_x_over_floor, 1),
                     f"{a.verify_ms_forward:.1f} ({a.floor_verify_ms_forward:.1f})",
                     fmt(a.verify_x_over_floor, 1)])
    return markdown_table(header, rows)
