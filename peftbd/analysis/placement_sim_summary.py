"""The simulated placement section's first screen (`peftbd.analysis.placement_sim`), in text only:
the cost models keyed once ([a], [b], ...), the validation's overall line and one verdict table,
a row per (hardware, model), a column per drafting method, each cell where split's tok/s per
device beats colocated's, the best ratio and the deciding term; every caption says SIMULATED.
`placement_sim_report` puts the details (and the figure) after it; the placement reports show it
when placement_sim.json sits beside the placement output (`read_beside`, `beside_lines`). No
figures here, so the placement experiment can show it without fingerprinting them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from peftbd.analysis.placement_sim import (
    MIN_REPEATS,
    REPORT_FILE,
    TOLERANCE,
    Comparison,
    SimReport,
    SimulatedRun,
    SimVerdict,
    ValidationRow,
)
from peftbd.analysis.tables import fmt_or_dash, markdown_table

SIM_SUBDIR = "placement_sim"
"""jobs.placement_sim's default output dir under the output root, beside `placement/`."""
MARKDOWN_FILE = "placement_sim.md"
MEASURABLE = "this box"
"""The hardware the measured repeats ran on: the simulated runs they validate."""
HEADING = "## Simulated placement (SIMULATED)"
DETAILS = "### Details (SIMULATED)"
LEGEND = (
    "Legend: a cell is split against colocated on tok/s per device (SIMULATED): the fewest "
    "clients where split beats colocated and the ratio there (never <= N: at no level up to N), "
    "the best ratio and its client count, then the term that decides it at that level (else the "
    "highest): utilization = the devices' mean busy fraction, split's over colocated's (the "
    "idler role named), batching = tokens per busy device-second, split's over colocated's; "
    "ahead = split drafting ahead against split. [a], [b], ...: the cost models above.")


def _letters(i: int) -> str:
    return chr(ord("a") + i) if i < 26 else f"m{i + 1}"


def cost_model_keys(runs: Sequence[SimulatedRun], verdicts: Sequence[SimVerdict] = ()
                    ) -> dict[str, str]:
    """{cost model: "[a]"}, each cost model once, in the runs' order (then the verdicts')."""
    names = dict.fromkeys([*(r.cost_model for r in runs), *(v.cost_model for v in verdicts)])
    return {name: f"[{_letters(i)}]" for i, name in enumerate(names)}


def cost_models_line(keys: dict[str, str]) -> str:
    """"cost models: [a] roofline: H100 ...; [b] ..."."""
    return "cost models: " + ("; ".join(f"{k} {name}" for name, k in keys.items()) or "-")


def where_words(c: Comparison) -> str:
    """Where `c.placement` first beats its baseline per device: "from 8 clients, 1.12x", or
    "never <= 64" (at no level up to the highest both ran)."""
    if c.beats_at is None:
        return f"never <= {max(c.levels, default=0)}"
    return f"from {c.beats_at} clients, {c.ratio_at or 0.0:.2f}x"


def best_words(c: Comparison) -> str:
    """"best 0.90x at 1" (the best ratio and its client count)."""
    if c.best_ratio is None:
        return "best -"
    return f"best {c.best_ratio:.2f}x at {c.best_at}"


def term_words(v: SimVerdict) -> str:
    """The deciding term in a few words: "utilization: 0.79x, drafter idles 28%" or "batching:
    0.64x tokens per busy device-second" ("deciding: not simulated" without busy fractions)."""
    if v.term is None:
        return "deciding: not simulated"
    if v.term == "efficiency":
        return f"batching: {v.efficiency or 0.0:.2f}x tokens per busy device-second"
    words = f"utilization: {v.utilization or 0.0:.2f}x"
    idle = v.busy.get(v.split.placement, {}).get(v.idle_role or "")
    if (v.utilization or 0.0) < 1 and idle is not None:
        return f"{words}, {v.idle_role} idles {1 - idle:.0%}"
    return f"{words}, split's devices busier" if (v.utilization or 0.0) > 1 else words


def verdict_cell(v: SimVerdict) -> str:
    """One verdict's table cell: where, the best ratio, the deciding term (and drafting ahead)."""
    cell = f"{where_words(v.split)}; {best_words(v.split)}; {term_words(v)}"
    if v.ahead is not None:
        cell += f"; ahead: {where_words(v.ahead)}, {best_words(v.ahead)}"
    return cell


def row_label(v: SimVerdict, keys: dict[str, str], placement: bool = False) -> str:
    """"H100 x1 · Qwen3-0.6B [a]" (with the split placement when a run has several)."""
    return " · ".join([v.hardware, v.model, *([v.split.placement] if placement else [])]) + (
        f" {keys[v.cost_model]}")


def verdict_table(verdicts: Sequence[SimVerdict], keys: dict[str, str]) -> str:
    """A row per (hardware, model[, split placement]), a column per method, `verdict_cell`s."""
    several = any(v.split.placement != "split" for v in verdicts)
    methods = list(dict.fromkeys(v.method for v in verdicts))
    rows: dict[str, dict[str, str]] = {}
    for v in verdicts:
        rows.setdefault(row_label(v, keys, several), {})[v.method] = verdict_cell(v)
    header = ["SIMULATED: hardware · model [cost model]", *methods]
    return markdown_table(header, [[label, *(cells.get(m, "-") for m in methods)]
                                   for label, cells in rows.items()])


def overall_line(rows: Sequence[ValidationRow], cost_models: str,
                 tolerance: float = TOLERANCE) -> str:
    """"SIMULATED (...) within 15% of measured at k of n levels; worst: ..." (a level is within
    when every metric of it is)."""
    levels: dict[tuple[str, str, int], bool] = {}
    for r in rows:
        key = (r.placement, r.method, r.concurrency)
        levels[key] = levels.get(key, True) and r.within
    flagged = len({(r.placement, r.method, r.concurrency) for r in rows if r.flagged})
    scored = [r for r in rows if r.error is not None]
    worst = max(scored, key=lambda r: abs(r.error or 0.0), default=None)
    words = "-" if worst is None else (
        f"{worst.metric} at {worst.placement}/{worst.method}/{worst.concurrency} clients, "
        f"{pct(worst.error)} (simulated {fmt_or_dash(worst.simulated)} vs measured "
        f"{worst.measured:.2f})")
    return (f"SIMULATED ({cost_models}) within {tolerance:.0%} of measured at "
            f"{sum(levels.values())} of {len(levels)} levels; worst: {words}"
            + (f"; {flagged} level(s) measured fewer than {MIN_REPEATS} times (no interval)"
               if flagged else ""))


def _measured_cell(r: ValidationRow) -> str:
    if r.interval is None:
        return f"{r.measured:.2f} (n={r.repeats} < {MIN_REPEATS}: no interval)"
    return f"{r.measured:.2f} (n={r.repeats}, {r.interval[0]:.2f}-{r.interval[1]:.2f})"


def validation_table(rows: Sequence[ValidationRow], cost_models: str,
                     tolerance: float = TOLERANCE) -> list[str]:
    """Measured (mean, 95% interval over the repeats) beside SIMULATED, per level and metric."""
    header = ["placement", "method", "clients", "metric", "measured (n repeats, 95% interval)",
              f"SIMULATED ({cost_models})", "error", f"within {tolerance:.0%}?"]
    table = [[r.placement, r.method, r.concurrency, r.metric, _measured_cell(r),
              fmt_or_dash(r.simulated), pct(r.error), "yes" if r.within else "no"] for r in rows]
    return ["", f"#### Measured beside SIMULATED ({cost_models}): {MEASURABLE}", "",
            markdown_table(header, table)]


def pct(error: float | None) -> str:
    return "-" if error is None else f"{error:+.0%}"


def validated_keys(runs: Sequence[SimulatedRun], keys: dict[str, str]) -> str:
    """"cost model [e]": the keys of the runs the measured repeats validate (this box's)."""
    here = [r for r in runs if r.hardware == MEASURABLE] or list(runs)
    return "cost model " + ", ".join(dict.fromkeys(keys[r.cost_model] for r in here))


def first_screen(runs: Sequence[SimulatedRun], validation: Sequence[ValidationRow] | None,
                 verdicts: Sequence[SimVerdict], tolerance: float = TOLERANCE,
                 link: str | None = None) -> list[str]:
    """The heading, the cost models, the validation's overall line (when validated), the verdict
    table and its legend (and a link to the details, `link`)."""
    if not runs:
        return []
    keys = cost_model_keys(runs, verdicts)
    lines = ["", HEADING, "", cost_models_line(keys)]
    if validation:
        lines += ["", overall_line(validation, validated_keys(runs, keys), tolerance)]
    lines += ["", verdict_table(verdicts, keys) if verdicts else
              "_SIMULATED: no verdict (no split placement simulated beside colocated)._",
              "", LEGEND]
    if link:
        lines += ["", f"Details, per-run tables and figure (SIMULATED): [{MARKDOWN_FILE}]({link})"]
    return lines


def sim_summary(report: SimReport, link: str | None = None) -> list[str]:
    """placement_sim.json's first screen (`first_screen`), as the placement reports show it."""
    return first_screen(report.runs, report.validation, report.verdicts, link=link)


def sim_path_beside(placement_dir: str | Path) -> Path:
    """Where jobs.placement_sim writes placement_sim.json by default, beside a placement output
    dir: `<output root>/placement_sim/` next to `<output root>/placement/`."""
    return Path(placement_dir).parent / SIM_SUBDIR / REPORT_FILE


def read_beside(placement_dir: str | Path) -> SimReport | None:
    """The placement_sim.json beside `placement_dir` (None: none there)."""
    path = sim_path_beside(placement_dir)
    return SimReport.read(path) if path.is_file() else None


def beside_lines(placement_dir: str | Path, page_dir: str | Path) -> list[str]:
    """The simulated section's first screen when placement_sim.json sits beside `placement_dir`,
    linking its placement_sim.md relative to `page_dir` (the page showing it); [] when absent,
    a line saying so when unreadable (the page around it is not lost over it)."""
    path = sim_path_beside(placement_dir)
    link = Path(os.path.relpath(path.with_name(MARKDOWN_FILE), page_dir)).as_posix()
    try:
        report = read_beside(placement_dir)
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        return ["", HEADING, "", f"_SIMULATED: {link} sits beside this run but its "
                f"{REPORT_FILE} could not be read ({type(exc).__name__}); rerun "
                "`python -m jobs.placement_sim`._"]
    return [] if report is None else sim_summary(report, link=link)
