"""The benchmark report: `report.md` + Figures 1-5, built only from `results.json`, stage
manifests and the simulated placement section's lines (when placement_sim.json sits beside the
placement experiment's output, read by the benchmark job).

`build_report` is a pure function of its inputs (no clock, no constants but the paper's quoted
numbers and the findings' tolerances), so rebuilding from the same artifacts gives the same report
and a changed artifact gives a changed report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from peftbd.analysis import tables
from peftbd.analysis.acceptance import gamma_table, position_table
from peftbd.analysis.categories import section as category_section
from peftbd.analysis.figures import (
    acceptance_by_position,
    acceptance_vs_temperature,
    save_png,
    speedup_vs_accepted,
    throughput_vs_accepted,
    throughput_vs_batch,
)
from peftbd.analysis import break_even, concurrency, cost_at_scale, head_goals, sampling
from peftbd.analysis.findings import SAME_COST, UNCHANGED, findings
from peftbd.analysis.findings_by_category import section as findings_by_category_section
from peftbd.analysis import learning_curves
from peftbd.analysis.acceptance_study import study_section
from peftbd.analysis.placement_verdict import PlacementSections
from peftbd.analysis.recipe_ablation import ablation_section
from peftbd.analysis.references import describe, reference_sentence
from peftbd.analysis.peer import section as peer_section
from peftbd.benchmarking.forward_paths import fell_back_line, path_words
from peftbd.benchmarking.schema import Results, draft_verify_per_call, draft_verify_per_round
from peftbd.layout import (
    acceptance_study_stage,
    benchmark_stage,
    peer_stage,
    placement_stage,
    recipe_ablation_stage,
    stages,
)
from peftbd.manifest import read_manifest
from peftbd.stage import lineage

REPORT = "report.md"
FIGURE_1 = "figure1_throughput_vs_accepted.png"
FIGURE_2 = "figure2_acceptance_by_position.png"
FIGURE_3 = "figure3_concurrency.png"
FIGURE_4 = "figure4_speedup_vs_acceptance.png"
FIGURE_5 = "figure5_acceptance_vs_temperature.png"
BENCHMARK_STAGE = benchmark_stage().title


def read_stage_manifests(upstream: Mapping[str, str | Path]) -> dict[str, dict[str, Any]]:
    """{stage title: manifest} of the artifacts in `upstream` ({stage name: dir}) and of
    everything they were built from, in the main job's stage order."""
    dirs = lineage(upstream)
    return {s.title: read_manifest(dirs[s.name]) for s in stages() if s.name in dirs}


MIN_TIMED_S = 3.0
"""Timed decoding per arm-repeat below which a run's tok/s is noise-dominated on a shared CPU."""


def _short_runs_note(results: Results) -> str:
    """A warning naming the arms whose shortest run timed under MIN_TIMED_S, or the shortest run."""
    shortest = {arm.label: min(r.decode_s for r in arm.repeats)
                for _, arm in results.arm_items() if arm.repeats}
    short = [f"{label} ({s:.2f} s)" for label, s in shortest.items() if s < MIN_TIMED_S]
    if short:
        return (f"**Too short to time reliably:** runs under {MIN_TIMED_S:g} s of timed decoding: "
                f"{', '.join(short)}; raise decoding.num_prompts or decoding.max_new_tokens.")
    return (f"Every run timed at least {min(shortest.values(), default=0):.1f} s of decoding "
            f"(>= {MIN_TIMED_S:g} s per arm and run).")


def untrained_note(results: Results) -> str | None:
    """A warning naming the drafters published untrained on purpose (`training.allow_untrained`)
    and why, or None when every drafter trained."""
    untrained = [f"`{name}` ({'; '.join(info.untrained_reasons or ['untrained'])})"
                 for name, info in results.drafters.items() if info.untrained]
    if not untrained:
        return None
    return ("**Untrained drafters** (published on purpose, training.allow_untrained): "
            f"{', '.join(untrained)}; their acceptance is not a trained drafter's.")


def concurrency_section(results: Results) -> list[str]:
    """The report's concurrency section: how it was timed, Table 8, Figure 3, each speculative
    arm's crossing of 1.0 and the engine goal (just a note when the run has no sweep)."""
    title = "## Table 8 and Figure 3: aggregate throughput and speedup vs AR per batch size"
    if not concurrency.batch_sizes(results):
        return [title, concurrency.NO_SWEEP]
    timing = results.timing
    return [
        title,
        "Every arm decodes the same prompts with continuous batching: at most B requests at once, "
        "a finished one's place taken by the next prompt before the next round. Each pass over "
        "the prompts is timed whole (batch 1: the batch-1 pass above), aggregate tok/s = "
        f"generated tokens / its wall time, {_median_words(timing.repeats, timing.sweep_repeats)}; "
        "vs AR = over AR's tok/s at the "
        "same B; exact = every output equals AR's batch-1 output for its prompt (on a GPU in "
        "bf16, batch-shape-dependent kernels can flip a near-tie, so a \"no\" there need not be a bug).",
        concurrency.concurrency_table(results),
        *filter(None, [concurrency.short_passes_note(results, MIN_TIMED_S)]),
        f"![Figure 3]({FIGURE_3})",
        "\n".join(f"- {line}" for line in
                  [*concurrency.crossovers(results), concurrency.engine_goal_sentence(results)]),
    ]


def _paths_words(results: Results) -> str:
    """" Forward paths: every forward eager (like for like)." from the arms' `paths` ("" for
    results written before arms recorded them), and on the fast path what compiling cost and
    whether any of it fell inside a timed pass."""
    paths = {arm_id: arm.paths for arm_id, arm in results.arms.items() if arm.paths}
    if not paths:
        return ""
    words = f" Forward paths: {path_words(paths)} (like for like)."
    compiled = [arm for arm in results.arms.values() if "compiled" in arm.paths.values()]
    if not compiled:
        return words
    timed = {arm_id: arm.timed_compiles for arm_id, arm in results.arms.items() if arm.timed_compiles}
    where = ("none inside a timed pass" if not timed else
             f"{sum(timed.values())} inside timed passes ("
             + ", ".join(f"{a}: {n}" for a, n in timed.items()) + "; their tok/s include compiling)")
    words = (f"{words} Compiling took {sum(a.compile_s for a in compiled):.0f} s over the workers, "
             f"in untimed warm-ups that run every timed pass once; {where}.")
    return words + _cuda_graph_words(results)


def _cuda_graph_words(results: Results) -> str:
    """On CUDA: whether every compiled arm replayed CUDA graphs, or loudly which did not."""
    on_cuda = {a: arm for a, arm in results.arms.items() if arm.cuda_graph_replays is not None}
    if not on_cuda:
        return ""
    if line := fell_back_line(on_cuda, "tok/s"):
        return f" **{line}**."
    return (f" CUDA graphs replayed in every compiled arm "
            f"({sum(a.cuda_graph_replays or 0 for a in on_cuda.values())} replays, no skips).")


def _runs_words(repeats: int) -> str:
    """"1 timed run" / "3 timed runs"."""
    return f"{repeats} timed run{'s' if repeats != 1 else ''}"


def _median_words(repeats: int, sweep_repeats: int) -> str:
    """How Table 8's aggregate tok/s is taken over the repeats (one pass: no median)."""
    if repeats <= 1:
        return "one timed pass"
    return f"median over the {repeats} repeats (at B > 1 the first {sweep_repeats})"


def _sweep_words(results: Results) -> str:
    sizes = concurrency.batch_sizes(results)
    return f" (and batch sizes {', '.join(map(str, sizes))}: Table 8)" if sizes else ""


def build_report(results: Results, manifests: dict[str, dict[str, Any]],
                 out_dir: str | Path, simulated: Sequence[str] = ()) -> Path:
    """Write `report.md` and Figures 1, 2 (3 with a concurrency sweep, 4 with a reference
    acceptance, 5 with a sampled temperature) into `out_dir` from `results` (the benchmark's
    results.json), `manifests` ({stage name: manifest.json}) and `simulated` (the simulated
    placement section's first screen, `placement_sim_summary.beside_lines`: shown after the
    placement experiment's verdict); return the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_png(throughput_vs_accepted(results), out_dir / FIGURE_1)
    save_png(acceptance_by_position(results), out_dir / FIGURE_2)
    if concurrency.batch_sizes(results):
        save_png(throughput_vs_batch(results), out_dir / FIGURE_3)
    if break_even.rows(results):
        save_png(speedup_vs_accepted(results), out_dir / FIGURE_4)
    if sampling.sampled(results):
        save_png(acceptance_vs_temperature(results), out_dir / FIGURE_5)
    mo, pr, tm = results.measured_on, results.prompts, results.timing
    ablation, study = recipe_ablation_stage(), acceptance_study_stage()
    parts = [
        f"# PEFT-BD benchmark report ({results.preset})",
        f"Measured on: **{mo.model}** ({mo.dtype}), engine: {mo.engine}, "
        f"hardware: {mo.hardware}.",
        f"Prompts: {pr.count} from {pr.source} (`{pr.path}`), greedy, batch 1"
        f"{_sweep_words(results)}{sampling.intro_words(results)}, "
        f"at most {pr.max_new_tokens} new tokens; "
        f"{_runs_words(tm.repeats)} per arm. "
        f"Timing: {tm.workers} worker(s), {tm.torch_threads} torch thread(s) each; {tm.how}"
        + _paths_words(results),
        *filter(None, [untrained_note(results)]),
        "## Summary", "\n".join(f"- {line}" for line in summary_lines(results)),
        "## Findings: the paper's (a)-(f) on this run",
        "The paper states its findings in prose; these are the six its results rest on, in its "
        "order, each judged from the numbers below ([brackets]: the paper's). \"About the same "
        f"cost\" = within ±{SAME_COST:.0%}, \"essentially unchanged\" = within ±{UNCHANGED:.0%}.",
        "\n".join(f.markdown() for f in findings(results)),
        *findings_by_category_section(results),
        "## Beyond the paper: does the block-diffusion head pay for itself?",
        "The head (DFlash-style: its own decoder layers draft a whole block in one forward from "
        "the verifier's hidden states, sharing its embeddings and LM head) against its goals: "
        "speedup vs AR and draft / verify per round on this run, accepted tokens per round "
        "(bonus included), and draft / verify per round at the paper's architecture (Table 7).",
        head_goals.goals_table(results),
        "## Figure 1: throughput vs accepted tokens per round",
        f"![Figure 1]({FIGURE_1})",
        "## Table 1: what a round costs: draft vs verify per round, and per forward call",
        "Draft / verify per round = a round's draft time (every draft call of the round) over its "
        "verify time; per call = one draft forward over one verify forward. Calls: one run over "
        "all prompts. x over floor = measured ms / the floor of the same work on this device "
        "(max(bytes / bandwidth, FLOPs / matmul rate) of one counted round; "
        f"{_floor_words(results)}): near 1 the time is the algorithm's, far above it the stack's.",
        tables.forward_table(results),
        "## Table 2: acceptance, greedy audit and throughput",
        tables.acceptance_table(results),
        reference_sentence(results),
        "## Table 3: repeated runs and the draft-cost oracle",
        tables.timing_noise(results),
        tables.repeats_table(results),
        _short_runs_note(results),
        "Draft-cost oracle: T(r) = T0 (1 - r * draft share), throughput(r) = accepted / T(r); "
        "the needed accepted length is target throughput * T(1).",
        tables.oracle_table(results),
        "## Table 4: acceptance per draft position",
        "Rate at position j = rounds whose accepted prefix reached j / rounds that proposed j "
        "(over every repeat; vLLM's num_accepted_tokens_per_pos).",
        position_table(results),
        "## Figure 2: acceptance rate vs draft position",
        f"![Figure 2]({FIGURE_2})",
        "## Table 5: the gamma^j assumption behind the linear-prefix loss (PEFT-BD arms)",
        "The loss weighs position j by gamma^(j-1): it assumes every drafted token is accepted "
        "with the same probability gamma, so position j is accepted with probability gamma^j and "
        "P(accept j | accepted j-1) = gamma at every j. Fitted gamma = accepted draft tokens / "
        "positions reached (the maximum-likelihood constant acceptance).",
        gamma_table(results),
        "## Table 6: the engine's accepted prefix vs the offline estimate",
        "Accepted draft tokens per round, bonus excluded. The engine: what it accepted here. The "
        "offline replay: the engine's rounds replayed from the drafter's forward on these "
        "prompts + AR's outputs at this budget (they differ only by float noise unless the "
        "engine drafts otherwise than training scores). Training's estimate: the same replay on "
        "its val rows at data.max_new_tokens (one step, unanchored, whole vocabulary), so its "
        "difference from the replay is how far the estimate carries to other rows and budgets.",
        tables.offline_table(results),
        f"## Table 7: cost at the paper's architecture ({cost_at_scale.LABEL})",
        cost_at_scale.describe(results),
        *([table] if (table := cost_at_scale.cost_table(results)) else []),
        *concurrency_section(results),
        *decode_section(results),
        *paper_question_section(results),
        *sampling.section(results, FIGURE_5),
        *placement_section(manifests, simulated),
        *learning_curves.section(manifests),
        *ablation_section(manifests.get(ablation.title), ablation.subdir),
        *study_section(manifests.get(study.title), study.subdir),
        *peer_section(manifests.get(peer_stage().title)),
    ]
    parts += category_section(results)
    parts += [
        "## The paper beside ours",
        "Different model, engine and hardware: compare shapes (draft vs verify latency, "
        "accepted length vs throughput), not absolute numbers.",
        tables.paper_table(results),
        "## Pipeline stages: wall time and peak memory",
        tables.stage_table(manifests),
    ]
    path = out_dir / REPORT
    path.write_text("\n\n".join(parts) + "\n")
    return path


def _floor_words(results: Results) -> str:
    floor = results.measured_on.floor
    if floor is None:
        return "not measured in this run"
    return (f"{floor.bytes_per_s / 1e9:.1f} GB/s and {floor.flops_per_s / 1e9:.0f} GFLOP/s "
            f"at {floor.dtype}, {floor.source}")


def decode_section(results: Results) -> list[str]:
    """Table 9: whole decodes at the paper's architecture under synthetic acceptance."""
    table = cost_at_scale.decode_table(results)
    if table is None:
        return []
    return ["## Table 9: measured at the paper's architecture (SYNTHETIC acceptance)",
            cost_at_scale.describe_decode(results) or "", table]


def placement_section(manifests: dict[str, dict[str, Any]],
                      simulated: Sequence[str] = ()) -> list[str]:
    """The placement experiment's verdict, when its output sits beside this run's (its manifest:
    `jobs.placement` records the verdict sentences there), then the simulated placement's first
    screen when one sits beside that (`simulated`: its lines, one paragraph here)."""
    stage = placement_stage()
    manifest = manifests.get(stage.title)
    sim = ["\n".join(simulated).strip()] if simulated else []
    if not manifest:
        return sim
    placement = PlacementSections.from_manifest(manifest)
    measured = ", ".join(placement.placements) or "none"
    return ["## Placement: does splitting draft and verify change the cost asymmetry?",
            f"From the placement experiment beside this run (`{stage.subdir}/placement.md`; "
            f"placements measured: {measured}; outputs identical across placements: "
            f"{'yes' if placement.outputs_identical else 'NO'}).",
            "\n".join(f"- {line}" for line in placement.verdicts)
            or "_The experiment computed no verdict (no split placement beside colocated)._",
            *sim]


def paper_question_section(results: Results) -> list[str]:
    """Table 10 and Figure 4: each arm's speedup over AR vs acceptance under every round cost,
    and the computed verdict at the paper's own acceptance."""
    table = break_even.table(results)
    if table is None:
        return []
    return ["## Table 10 and Figure 4: the paper's question at its own acceptance",
            "speedup(a) = a x AR step / round time, from each round-cost source this run has; "
            "break-even = round / AR step. Reference acceptance: the paper's (PEFT-BD 2.881, "
            "FastMTP 1.511 tokens per round) or the synthetic arm's target.",
            "\n".join(f"- {line}" for line in break_even.verdict(results)),
            table, f"![Figure 4]({FIGURE_4})"]


def summary_lines(results: Results) -> list[str]:
    """A few lines for the end of the main job: throughput, accepted length, audit and what a
    round's drafting costs against its verify (per round; per forward call beside it) per arm."""
    lines = []
    for _, arm in results.arm_items():
        tps, acc, audit = arm.tokens_per_s, arm.mean_accepted, arm.audit
        ci, speedup = tps.ci95, arm.speedup_vs_ar
        spread = (f" tok/s (95% interval {ci[0]:.1f}-{ci[1]:.1f})" if ci else
                  f" ± {tps.std:.1f} tok/s" if len(arm.repeats) > 1 else " tok/s")
        line = f"{arm.label}: {tps.mean:.1f}{spread}"
        if speedup is not None and arm.speculative:
            line += f", {speedup.mean:.2f}x AR"
        line += f", {acc.mean:.2f} accepted/round"
        if audit is not None:
            line += f", audit {audit.exact}/{audit.prompts} exact"
        per_round, per_call = draft_verify_per_round(arm), draft_verify_per_call(arm)
        if per_round is not None:
            line += f", draft/verify {per_round:.2f} per round"
            if per_call is not None:
                line += f" ({per_call:.2f} per call)"
        lines.append(line)
    if results.references:
        lines.append("AR vs independent engines: " + "; ".join(map(describe, results.references)))
    if fell := fell_back_line(results.arms, "tok/s"):
        lines.append(fell)
    return lines
