"""The report's Markdown tables, each a pure function of `results.json` (and stage manifests).

Every number comes from the `Results` passed in (`peftbd.benchmarking.schema`) or the manifests;
the only constants are the paper's quoted values (`peftbd.analysis.paper`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from peftbd.analysis.paper import METRICS, PAPER_VALUES, SETUPS, PaperValue
from peftbd.benchmarking.schema import (
    ORACLE_TARGETS,
    Arm,
    Results,
    Stat,
    Throughput,
    draft_verify_per_call,
    draft_verify_per_round,
)
from peftbd.methods import methods
from peftbd.methods.arm import AR
from peftbd.methods.fastmtp import ID as FASTMTP
from peftbd.intervals import METHOD

NA = "n/a"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; cells are str()-ed, None becomes `n/a`."""
    def cell(v: Any) -> str:
        return NA if v is None else str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: float | None, digits: int = 2) -> str | None:
    """`value` with `digits` decimals, None stays None."""
    return None if value is None else f"{value:.{digits}f}"


def fmt_or_dash(value: float | None, digits: int = 2) -> str:
    """`fmt`, with "-" for None (a number a sentence or a cell did not get)."""
    return fmt(value, digits) or "-"


def fmt_stat(s: Stat | None, digits: int = 2, *, repeats: int) -> str | None:
    """`mean ± std` of a Stat over `repeats` runs; the mean alone for a single run or a std that
    rounds to 0 at `digits` (a "± 0.0" would be false precision)."""
    if s is None:
        return None
    spread = f"{s.std:.{digits}f}"
    if repeats <= 1 or float(spread) == 0:
        return f"{s.mean:.{digits}f}"
    return f"{s.mean:.{digits}f} ± {spread}"


def fmt_tokens_per_s(tps: Throughput, repeats: int) -> str:
    """Mean tok/s (1 decimal) with its 95% interval over the prompts when it has one,
    else ± the std over more than one repeat, else the mean alone."""
    if tps.ci95:
        return fmt_ci(tps.mean, tps.ci95, 1) or NA
    return fmt_stat(tps, 1, repeats=repeats) or NA


def tokens_per_s_header(results: Results) -> str:
    """Table 2's tok/s column header, naming the spread `fmt_tokens_per_s` shows."""
    arms = [arm for _, arm in results.arm_items()]
    if any(arm.tokens_per_s.ci95 for arm in arms):
        return "tok/s (95% interval)"
    return "tok/s (mean ± std)" if any(len(arm.repeats) > 1 for arm in arms) else "tok/s"


def fmt_ci(value: float | None, interval: Sequence[float] | None, digits: int = 2) -> str | None:
    """`value (low-high)` with its 95% interval, the value alone without one; None stays None."""
    if value is None:
        return None
    if not interval:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} ({interval[0]:.{digits}f}-{interval[1]:.{digits}f})"


def fmt_pct(value: float | None) -> str | None:
    """A fraction in [0, 1] as a percentage."""
    return None if value is None else f"{100 * value:.1f}%"


def forward_table(results: Results) -> str:
    """Table 1: what a round costs (draft ms per round, every draft call summed, over verify ms
    per round) first, then the forward calls (one run, all prompts) and their mean latency."""
    rows = []
    for _, arm in results.arm_items():
        d, v, rnd, floor = arm.forward.draft, arm.forward.verify, arm.round, arm.floor
        rows.append([arm.label, fmt(draft_verify_per_round(arm)),
                     fmt(rnd.draft_ms) if arm.speculative else None, fmt(rnd.verify_ms),
                     d.calls, fmt(d.mean_ms), v.calls, fmt(v.mean_ms),
                     fmt(draft_verify_per_call(arm)),
                     fmt(None if floor is None else floor.draft_x, 1),
                     fmt(None if floor is None else floor.verify_x, 1)])
    return markdown_table(
        ["arm", "draft / verify per round", "draft ms / round", "verify ms / round",
         "draft calls", "draft ms / call", "verify calls", "verify ms / call",
         "draft / verify per call", "draft x over floor", "verify x over floor"], rows)


def acceptance_table(results: Results) -> str:
    """Table 2: accepted tokens per round (bonus included) with its 95% interval over
    the prompts, token and block acceptance, greedy audit and throughput per arm."""
    rows = []
    for _, arm in results.arm_items():
        audit = arm.audit
        exact = "reference"  # AR: the audit's reference
        if audit is not None:
            pct = NA if audit.exact_pct is None else f"{audit.exact_pct:.1f}%"
            exact = f"{pct} ({audit.exact}/{audit.prompts})"
        rows.append([
            arm.label, fmt_ci(arm.mean_accepted.mean, arm.mean_accepted_ci95),
            fmt_pct(arm.token_acceptance), fmt_pct(arm.block_acceptance), exact,
            fmt_tokens_per_s(arm.tokens_per_s, len(arm.repeats)),
        ])
    return markdown_table(
        ["arm", "accepted tokens / round (95% interval)", "token acceptance", "block acceptance",
         "greedy audit exact", tokens_per_s_header(results)], rows)


def fmt_interval(interval: Sequence[float] | None, digits: int = 2) -> str | None:
    """`[low, high]` of an interval, None stays None."""
    return None if not interval else f"[{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def timing_noise(results: Results) -> str:
    """One sentence: how the batch-1 throughputs' noise is stated, and how wide it is here."""
    widths = [(ci[1] - ci[0]) / 2 / arm.tokens_per_s.mean for _, arm in results.arm_items()
              if (ci := arm.tokens_per_s.ci95) and arm.tokens_per_s.mean]
    span = (f": ±{min(widths):.0%} to ±{max(widths):.0%} of the tok/s across the arms"
            if widths else "")
    repeats = results.timing.repeats
    return (f"Timing noise: {repeats} timed repeat(s) of every prompt per arm; the intervals are "
            f"95% intervals over the prompts ({METHOD}; speedups paired prompt by prompt with "
            f"AR){span}.")


def _runs(arm: Arm, n: int) -> list[str | None]:
    """Each of the arm's `n` runs' tok/s and their mean ± std, when there is more than one run
    (one run's tok/s is the mean, in its own column); empty for one."""
    if n <= 1:
        return []
    runs = [fmt(r.tokens_per_s, 1) for r in arm.repeats]
    return [*runs, *[None] * (n - len(runs)), fmt_stat(arm.tokens_per_s, 1, repeats=len(runs))]


def repeats_table(results: Results) -> str:
    """Table 3a: with more than one repeated run, each run's throughput and mean ± std per arm;
    the mean tok/s with its interval over the prompts, and the speedup vs AR with its
    paired one. Accepted tokens per round without a spread: greedy repeats decode the same rounds
    (Table 2 gives its interval over the prompts)."""
    arms = results.arm_items()
    n = max((len(arm.repeats) for _, arm in arms), default=0)
    rows = []
    for _, arm in arms:
        shortest = min((r.decode_s for r in arm.repeats), default=None)
        speedup = arm.speedup_vs_ar
        rows.append([arm.label, *_runs(arm, n), fmt(arm.tokens_per_s.mean, 1),
                     fmt_interval(arm.tokens_per_s.ci95, 1),
                     fmt(None if speedup is None else speedup.mean),
                     fmt_interval(None if speedup is None else speedup.ci95),
                     fmt(arm.mean_accepted.mean), fmt(shortest, 1)])
    runs = [*[f"run {i + 1} tok/s" for i in range(n)], "tok/s (mean ± std)"] if n > 1 else []
    return markdown_table(
        ["arm", *runs, "tok/s (mean)", "tok/s 95% interval", "speedup vs AR",
         "speedup 95% interval", "accepted / round", "timed s per run (shortest)"], rows)


def oracle_table(results: Results) -> str:
    """Table 3b: the draft-cost oracle per speculative arm: measured T0 and draft share, the
    throughput at each draft-cost reduction r, and the accepted length needed (at r = 1) to match
    each target arm's measured throughput."""
    arms = [(arm, oracle) for _, arm in results.arm_items()
            if arm.speculative and (oracle := arm.oracle)]
    if not arms:
        return "_No speculative arm has oracle numbers._"
    rs = [red.r for red in arms[0][1].reductions]
    labels = {a: arm.label for a, arm in results.arm_items()}
    targets = [t for t in ORACLE_TARGETS if t in labels]
    rows = []
    for arm, oracle in arms:
        by_r = {red.r: red.tokens_per_s for red in oracle.reductions}
        rows.append([
            arm.label, fmt(arm.round.t0_s, 4), fmt(arm.round.draft_share, 3),
            fmt(arm.mean_accepted.mean), *[fmt(by_r.get(r), 1) for r in rs],
            *[fmt(oracle.needed_accepted.get(t), 2) for t in targets],
        ])
    return markdown_table(
        ["arm", "T0 s/round", "draft share", "accepted / round",
         *[f"tok/s at r={r:g}" for r in rs],
         *[f"accepted needed to match {labels[t]}" for t in targets]], rows)


OFFLINE_AGREES = 0.2
"""The engine's accepted prefix should be within this of the offline estimate on its prompts."""


def training_estimates(results: Results) -> dict[str, float]:
    """{arm id: its drafter's training estimate (`eval_accepted_prefix_mean`)} for each arm that
    decodes as its training evaluation drafts: the first arm, in report order, drafting from each
    training stage's output (its method lists that arm first, e.g. PEFT-BD's one step unanchored,
    the head's whole vocabulary). An arm's stage is the one results.json records, else (not
    recorded) its method's main stage; its drafter, the `drafters` entry of that stage's output
    subdir. Arms of AR or of a method not registered here have none."""
    registered = {m.id: m for m in methods()}
    subdirs = {s.name: s.subdir for m in registered.values() for s in m.stages}
    seen: set[str] = set()
    out: dict[str, float] = {}
    for arm_id, arm in results.arm_items():
        m = registered.get(arm.method)
        stage = arm.stage or (m.stage.name if m and m.stage else None)
        if stage is None or stage in seen:
            continue
        seen.add(stage)
        subdir = subdirs.get(stage)
        drafter = None if subdir is None else results.drafters.get(subdir)
        estimate = None if drafter is None else drafter.metrics.get("eval_accepted_prefix_mean")
        if estimate is not None:
            out[arm_id] = estimate
    return out


def _relative(value: float | None, reference: float | None) -> str | None:
    return None if value is None or not reference else f"{value / reference - 1:+.0%}"


def offline_table(results: Results) -> str:
    """Table 6: per arm with an offline replay, the engine's accepted prefix per round (bonus
    excluded) beside the engine's rounds replayed offline on the same prompts and budget
    (`replay`), whether they agree within OFFLINE_AGREES, and the training run's estimate on its
    eval rows (`eval_accepted_prefix_mean`) with its difference from the replay."""
    estimates, rows = training_estimates(results), []
    for arm_id, arm in results.arm_items():
        replay = None if arm.replay is None else arm.replay.mean_accepted_prefix
        engine = arm.mean_accepted_prefix
        training = estimates.get(arm_id)
        if engine is None or (replay is None and training is None):
            continue
        verdict = None if not replay else (
            "yes" if abs(engine / replay - 1) <= OFFLINE_AGREES else "no")
        rows.append([arm.label, fmt(engine), fmt(replay), _relative(engine, replay),
                     verdict, fmt(training), _relative(training, replay)])
    if not rows:
        return "_No arm has an offline estimate._"
    return markdown_table(["arm", "engine (this benchmark)", "offline replay (these prompts)",
                           "engine vs replay", f"within ±{OFFLINE_AGREES:.0%}",
                           "training estimate (its val rows)", "training vs replay"], rows)


def _ours(results: Results, pv: PaperValue) -> float | None:
    """Our value for the paper's metric `pv.metric` of arm `pv.arm`, looked up in `results`."""
    arm = results.arms.get(pv.arm)
    if arm is None:
        return None
    oracle = arm.oracle
    lookups: dict[str, Callable[[], float | None]] = {
        "tokens_per_s": lambda: arm.tokens_per_s.mean,
        "mean_accepted": lambda: arm.mean_accepted.mean,
        "draft_calls": lambda: arm.forward.draft.calls,
        "verify_calls": lambda: arm.forward.verify.calls,
        "draft_mean_ms": lambda: arm.forward.draft.mean_ms,
        "verify_mean_ms": lambda: arm.forward.verify.mean_ms,
        "t0_s": lambda: arm.round.t0_s,
        "draft_share": lambda: arm.round.draft_share,
        "free_draft_tokens_per_s": lambda: None if oracle is None else next(
            (r.tokens_per_s for r in oracle.reductions if r.r == 1.0), None),
        "needed_accepted_vs_fastmtp": lambda: (
            None if oracle is None else oracle.needed_accepted.get(FASTMTP)),
        "needed_accepted_vs_ar": lambda: None if oracle is None else oracle.needed_accepted.get(AR),
    }
    return lookups[pv.metric]()


def paper_table(results: Results) -> str:
    """The paper's numbers beside ours, with what each side was measured on."""
    mo = results.measured_on
    labels = {a: arm.label for a, arm in results.arm_items()}
    rows = []
    for pv in PAPER_VALUES:
        ours = _ours(results, pv)
        rows.append([labels.get(pv.arm, pv.arm), METRICS[pv.metric], pv.quoted, pv.measured_on,
                     None if ours is None else f"{ours:.4g}"])
    legend = [f"- paper, {key}: {text}" for key, text in SETUPS.items()]
    legend.append(f"- ours: {mo.model} ({mo.dtype}), {mo.engine}, {mo.hardware}")
    table = markdown_table(["arm", "metric", "paper", "paper setup", "ours"], rows)
    return "\n".join(legend) + "\n\n" + table


def stage_table(manifests: dict[str, dict[str, Any]]) -> str:
    """Each pipeline stage's wall time and peak memory, read from its manifest: the driver's
    RSS, and the peaks and dtype of the workers that held the models (`workers`: generate's
    actors, training workers, benchmark workers; n/a for a stage without workers)."""
    rows = []
    for name, m in manifests.items():
        wall = m.get("wall_seconds", m.get("build_seconds"))
        w = m.get("workers") or {}
        rows.append([name, fmt(wall, 1), fmt(m.get("driver_peak_rss_mib", m.get("peak_rss_mib")), 0),
                     fmt(w.get("peak_rss_mib"), 0), fmt(w.get("peak_gpu_mib"), 0), w.get("dtype")])
    return markdown_table(["stage", "wall s", "driver peak RSS MiB", "worker peak RSS MiB",
                           "worker peak GPU MiB", "dtype"], rows)
