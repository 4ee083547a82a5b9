"""The simulated placement section in Markdown and its figure (`peftbd.analysis.placement_sim`):
the first screen (`peftbd.analysis.placement_sim_summary`: the cost models keyed once, the
validation's overall line, one verdict table), then the details: every verdict in full, the
simulation beside the measured repeats, each simulated run's table; every heading, table caption
and figure title says SIMULATED and names its cost model (the figure in full, the tables by key)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from peftbd.analysis.figures import (
    MARKERS,
    PANEL_TITLE_CHARS,
    _figure,
    _gaps,
    _legend_right,
    save_png,
)
from peftbd.analysis.placement import busy_words
from peftbd.analysis.placement_sim import (
    TOLERANCE,
    Comparison,
    SimulatedRun,
    SimVerdict,
    ValidationRow,
)
from peftbd.analysis.placement_sim_summary import (
    DETAILS,
    cost_model_keys,
    first_screen,
    row_label,
    validated_keys,
    validation_table,
)
from peftbd.analysis.placement_verdict import Capacity
from peftbd.analysis.tables import fmt_or_dash, markdown_table

LINE_STYLES = ("-", "--", ":", "-.")


def _models(runs: Sequence[SimulatedRun]) -> str:
    """The runs' cost models, each once, in order."""
    return ", ".join(dict.fromkeys(r.cost_model for r in runs)) or "-"


def _beats_words(c: Comparison) -> str:
    best = (f"best {c.best_ratio:.2f}x at {c.best_at}" if c.best_ratio is not None
            else "no tok/s per device to compare")
    if c.beats_at is None:
        return (f"{c.placement} never beats {c.baseline}'s tok/s per device up to "
                f"{max(c.levels, default=0)} clients ({best})")
    return (f"{c.placement} beats {c.baseline}'s tok/s per device from {c.beats_at} clients "
            f"({c.ratio_at:.2f}x; {best})")


def _cap(c: Capacity | None, per_verifier: float | None) -> str:
    return "-" if c is None or per_verifier is None else (
        f"{'>= ' if c.censored else ''}{per_verifier:.1f}")


def capacity_words(v: SimVerdict) -> str:
    """"32.0 colocated vs >= 64.0 split (>= 2.00x)": capacity per verifier device."""
    (cc, cs), (pc, ps) = v.capacity, v.capacity_per_verifier
    value, kind = v.capacity_gain
    gain = "unknown" if value is None or kind == "unknown" else f"{kind} {value:.2f}x".strip()
    return f"{_cap(cc, pc)} colocated vs {_cap(cs, ps)} {v.split.placement} ({gain})"


def _ahead_words(v: SimVerdict) -> str:
    if v.ahead is None:
        return "-"
    p50 = v.ahead.p50_ms
    return _beats_words(v.ahead) + (
        f", p50 at {v.ahead.levels[0]} client{'s' * (v.ahead.levels[0] > 1)} "
        f"{p50[0]:.0f} -> {p50[1]:.0f} ms" if p50 else "")


def _verdicts(verdicts: Sequence[SimVerdict], keys: dict[str, str]) -> list[str]:
    ahead = any(v.ahead is not None for v in verdicts)
    header = ["SIMULATED: hardware · model [cost model]", "method", "split vs colocated",
              "capacity per verifier device", "deciding term", *(["drafting ahead"] * ahead)]
    rows = [[row_label(v, keys), v.method, _beats_words(v.split), capacity_words(v), v.deciding,
             *([_ahead_words(v)] * ahead)] for v in verdicts]
    return ["", "#### Verdicts in full (SIMULATED)", "", markdown_table(header, rows)]


def _run_table(run: SimulatedRun, keys: dict[str, str]) -> list[str]:
    header = ["placement", "method", "clients", "tok/s per device", "p50 ms", "busy per role"]
    rows = [[r.placement, r.method, r.concurrency, fmt_or_dash(r.tokens_per_s_per_device, 1),
             f"{r.p50_ms:.0f}", busy_words(r.busy)]
            for r in sorted(run.rows, key=lambda r: (r.placement, r.method, r.concurrency))]
    return ["", f"#### SIMULATED: {run.hardware} · {run.model} (cost model {keys[run.cost_model]})",
            "", markdown_table(header, rows)]


def sim_markdown(runs: Sequence[SimulatedRun], validation: Sequence[ValidationRow] | None,
                 verdicts: Sequence[SimVerdict], tolerance: float = TOLERANCE) -> list[str]:
    """The report's simulated section: its first screen (`first_screen`: the cost models keyed
    once, the validation's overall line, the verdict table, a legend), then the details: every
    verdict in full, the validation against measured repeats (when given), a table per run."""
    if not runs:
        return []
    keys = cost_model_keys(runs, verdicts)
    lines = [*first_screen(runs, validation, verdicts, tolerance), "", DETAILS]
    if verdicts:
        lines += _verdicts(verdicts, keys)
    if validation:
        lines += validation_table(validation, validated_keys(runs, keys), tolerance)
    for run in runs:
        lines += _run_table(run, keys)
    return lines


def sim_figure(runs: Sequence[SimulatedRun], path: str | Path) -> Path:
    """A panel per (hardware, model): tok/s per device against clients (log2), a colour and
    marker per placement, a line style per method (and per cost model where a panel has
    several); every title says SIMULATED and names the cost model(s)."""
    panels: dict[tuple[str, str], list[SimulatedRun]] = {}
    for run in runs:
        panels.setdefault((run.hardware, run.model), []).append(run)
    placements = sorted({r.placement for run in runs for r in run.rows})
    methods = sorted({r.method for run in runs for r in run.rows})
    fig, axes = _figure(4.2 * max(len(panels), 1) + 2.8, 4.4, panels=max(len(panels), 1))
    for ax, ((hardware, model), mine) in zip(axes, panels.items()):
        levels: set[int] = set()
        for k, run in enumerate(mine):
            for placement in sorted({r.placement for r in run.rows}):
                for method in sorted({r.method for r in run.rows if r.placement == placement}):
                    rows = sorted((r for r in run.rows if (r.placement, r.method)
                                   == (placement, method)), key=lambda r: r.concurrency)
                    levels |= {r.concurrency for r in rows}
                    i = placements.index(placement)
                    label = f"{placement} · {method}" + (
                        f" · {run.cost_model}" if len(mine) > 1 else "")
                    ax.plot([r.concurrency for r in rows],
                            _gaps([r.tokens_per_s_per_device for r in rows]), label=label,
                            color=f"C{i}", marker=MARKERS[i % len(MARKERS)],
                            markerfacecolor="none",
                            linestyle=LINE_STYLES[(methods.index(method) + k) % len(LINE_STYLES)])
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(levels), [str(c) for c in sorted(levels)])
        ax.set_xlabel("clients (closed loop)")
        ax.set_ylabel("tokens / s per device (SIMULATED)")
        ax.set_title(textwrap.fill(f"SIMULATED: {hardware} · {model}, cost model "
                                   f"{_models(mine)}", PANEL_TITLE_CHARS), fontsize=8)
        ax.grid(alpha=0.3)
    _legend_right(fig, axes)
    fig.suptitle(f"SIMULATED placement: tok/s per device vs clients ({_models(runs)})",
                 fontsize=9)
    return save_png(fig, path)
