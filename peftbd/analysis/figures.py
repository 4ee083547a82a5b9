"""The report's figures (PNG, Agg backend), each a pure function of results.json.

Figure 1: throughput vs mean accepted tokens per round, one point per arm. Figure 2: acceptance
rate vs draft position, one line per speculative arm, beside the loss's gamma^j. Figure 3:
aggregate throughput and speedup vs AR against the batch size, one line per arm. Figure 4:
speedup vs AR against accepted tokens per round under each round-cost source. Figure 5: accepted
tokens per round against the temperature, one line per arm that samples.

Arms can coincide (the 1-step and anchored PEFT-BD points often do), so no marker may hide
another: each arm has its own colour and shape, all markers are hollow and each is smaller than
the one drawn before it (and drawn above it); Figure 1 also names every point where the name
overlaps no marker, no other name and not the legend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.legend import Legend  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from peftbd.analysis import break_even  # noqa: E402
from peftbd.analysis.acceptance import prefix_gamma  # noqa: E402
from peftbd.benchmarking.schema import Results  # noqa: E402

MARKERS = "osD^vP*Xh"
LARGEST_MARKER, MARKER_STEP = 16.0, 1.5
LABEL_LINE = 9.0  # points between stacked point names


def _marker_style(i: int) -> dict[str, Any]:
    """Line2D keywords of the i-th arm (in report order): its colour and shape, hollow, smaller
    than and drawn above every arm before it."""
    return {"color": f"C{i}", "marker": MARKERS[i % len(MARKERS)], "markerfacecolor": "none",
            "markersize": max(LARGEST_MARKER - MARKER_STEP * i, 4.0), "markeredgewidth": 1.8,
            "zorder": 3 + i}


def _gaps(values: Sequence[float | None]) -> list[float]:
    """`values` with None (not measured) as NaN: a gap in the line, as matplotlib draws None."""
    return [math.nan if v is None else v for v in values]


def _marker_box(ax: Axes, x: float, y: float, size: float) -> Bbox:
    """The display-space square a marker of `size` points covers at (x, y)."""
    (cx, cy), half = ax.transData.transform((x, y)), size / 2 * ax.figure.dpi / 72
    return Bbox.from_extents(cx - half, cy - half, cx + half, cy + half)


Point = tuple[float, float, str, dict[str, Any]]
"""A named point: (x, y, its name, its marker style)."""


def _label_points(fig: Figure, ax: Axes, legend: Legend, points: list[Point]) -> None:
    """Name each point, right of it or else left of it, where the name stays inside the figure
    and overlaps no marker, no earlier name and not `legend`, moving down a line at a time until
    it does. Call after the layout is final."""
    canvas = fig.canvas  # Agg's (this module's backend): it measures text with its renderer
    if not isinstance(canvas, FigureCanvasAgg):
        raise TypeError(f"figures draw on the Agg backend, not on {type(canvas).__name__}")
    renderer = canvas.get_renderer()
    placed = [legend.get_window_extent(renderer),
              *(_marker_box(ax, x, y, style["markersize"]) for x, y, _, style in points)]
    spots = [(side * 10, 4 - LABEL_LINE * line, side)
             for line in range(len(points) + 1) for side in (1, -1)]
    for x, y, text, style in points:
        for dx, dy, side in spots:
            label = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points",
                                fontsize=7, color=style["color"], va="center",
                                ha="left" if side > 0 else "right", annotation_clip=False)
            box = label.get_window_extent(renderer)
            inside = fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1
            if inside and not any(box.overlaps(other) for other in placed):
                break
            label.remove()
        placed.append(box)


def throughput_vs_accepted(results: Results) -> Figure:
    """Figure 1: each arm's mean throughput (error bar: std over repeated runs) against its mean
    accepted tokens per round (error bar: its 95% interval over the prompts, else std over runs)."""
    fig, ax = plt.subplots(figsize=(7.2, 4.8), dpi=120)
    points: list[Point] = []
    for i, (_, arm) in enumerate(results.arm_items()):
        tps, acc = arm.tokens_per_s, arm.mean_accepted
        style = _marker_style(i)
        ci = arm.mean_accepted_ci95
        xerr = [[acc.mean - ci[0]], [ci[1] - acc.mean]] if ci else acc.std or None
        ax.errorbar(acc.mean, tps.mean, xerr=xerr, yerr=tps.std or None,
                    linestyle="none", capsize=4, label=arm.label, **style)  # no bar for std 0
        points.append((acc.mean, tps.mean, arm.label, style))
    mo = results.measured_on
    ax.set_xlabel("mean accepted tokens per round")
    ax.set_ylabel("output tokens / s (batch 1, greedy)")
    ax.set_title(f"Throughput vs accepted length\n{mo.model} · {mo.hardware}", fontsize=9)
    ax.margins(x=0.3, y=0.15)
    ax.grid(alpha=0.3)
    legend = ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    _label_points(fig, ax, legend, points)
    return fig


def acceptance_by_position(results: Results) -> Figure:
    """Figure 2: per speculative arm, the share of rounds proposing position j whose accepted
    prefix reached j, against j; dashed: gamma^j at the PEFT-BD training gamma."""
    fig, ax = plt.subplots(figsize=(7.2, 4.4), dpi=120)
    depth = 0
    for i, (_, arm) in enumerate(results.arm_items()):
        rates = arm.per_position.rate
        if arm.speculative and rates:
            ax.plot(range(1, len(rates) + 1), _gaps(rates), label=arm.label, **_marker_style(i))
            depth = max(depth, len(rates))
    gamma = prefix_gamma(results)
    js = range(1, depth + 1)
    ax.plot(js, [gamma ** j for j in js], "k--", linewidth=1, zorder=2,
            label=f"gamma^j, training gamma = {gamma:g} (the loss's assumption)")
    ax.set_xlabel("draft position j")
    ax.set_ylabel("P(accepted prefix >= j)")
    ax.set_title("Acceptance per draft position", fontsize=9)
    ax.set_xticks(list(js))
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def throughput_vs_batch(results: Results) -> Figure:
    """Figure 3: per arm (results.json `concurrency`), aggregate tok/s (left, log scale) and
    speedup vs AR (right; dashed: 1.0, where drafting stops paying) against the batch size."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.0, 4.4), dpi=120)
    rows = results.concurrency
    for i, (arm_id, arm) in enumerate(results.arm_items()):
        mine = sorted((r for r in rows if r.arm == arm_id), key=lambda r: r.batch_size)
        if not mine:
            continue
        style = _marker_style(i)
        sizes = [r.batch_size for r in mine]
        left.plot(sizes, [r.tokens_per_s for r in mine], label=arm.label, **style)
        if arm.speculative:
            right.plot(sizes, _gaps([r.speedup_vs_ar for r in mine]), label=arm.label, **style)
    right.axhline(1.0, color="k", linestyle="--", linewidth=1, zorder=2, label="AR (1.0)")
    sizes = sorted({r.batch_size for r in rows})
    for ax, ylabel in ((left, "aggregate output tokens / s"), (right, "speedup vs AR (same batch)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("batch size (requests decoding at once)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best", markerscale=0.6)
    left.set_yscale("log")
    mo = results.measured_on
    fig.suptitle(f"Throughput and speedup vs batch size · {mo.model} · {mo.hardware}",
                 fontsize=9)
    fig.tight_layout()
    return fig


def speedup_vs_accepted(results: Results) -> Figure:
    """Figure 4: per round-cost source (a panel each), every arm with a reference acceptance:
    speedup over AR against accepted tokens per round (`peftbd.analysis.break_even`), with
    markers at this run's acceptance (o), the reference's (*) and the break-even point (x)."""
    sources, refs = break_even.cost_sources(results), break_even.reference_acceptance(results)
    fig, axes = plt.subplots(1, max(len(sources), 1), figsize=(4.2 * max(len(sources), 1), 4.2),
                             dpi=120, squeeze=False)
    top = max([ref for ref, _ in refs.values()] + [2.0]) + 1
    for ax, src in zip(axes[0], sources):
        for i, (arm, (ref, _)) in enumerate(refs.items()):
            if arm not in src.round_ms:
                continue
            here = results.arms[arm].mean_accepted.mean
            xs = [1 + j * (top - 1) / 60 for j in range(61)]
            color = f"C{i}"
            ax.plot(xs, [src.speedup(arm, x) for x in xs], color=color,
                    label=results.arms[arm].label)
            ax.plot([here], [src.speedup(arm, here)], "o", color=color, markerfacecolor="none")
            ax.plot([ref], [src.speedup(arm, ref)], "*", color=color, markersize=11)
            if src.break_even(arm) <= top:
                ax.plot([src.break_even(arm)], [1.0], "x", color=color, markersize=9)
        ax.axhline(1.0, color="k", linestyle="--", linewidth=1)
        ax.set_title(src.name, fontsize=7)
        ax.set_xlabel("accepted tokens per round (bonus included)")
        ax.set_ylabel("speedup vs greedy AR")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("Speedup vs acceptance: o this run, * reference (paper / synthetic), "
                 "x break-even", fontsize=9)
    fig.tight_layout()
    return fig


def acceptance_vs_temperature(results: Results) -> Figure:
    """Figure 5: per arm with sampled entries (results.json `sampling`; not the synthetic arms),
    accepted tokens per round (bonus included) against the temperature (0: greedy). Needs a run
    with sampling (`peftbd.analysis.sampling.sampled`)."""
    block = results.sampling
    if block is None:
        raise ValueError("results.json has no `sampling`: this run sampled no temperatures")
    fig, ax = plt.subplots(figsize=(7.2, 4.4), dpi=120)
    for i, (arm_id, arm) in enumerate(results.arm_items()):
        mine = block.arms.get(arm_id)
        if mine and not mine.skipped and mine.by_temperature:
            entries = mine.by_temperature
            ax.plot([e.temperature for e in entries], [e.mean_accepted for e in entries],
                    label=arm.label, **_marker_style(i))
    ax.set_xticks(block.temperatures)
    ax.set_xlabel("temperature (0: greedy)")
    ax.set_ylabel("accepted tokens per round (bonus included)")
    ax.set_title(f"Acceptance under sampling ({block.prompts} prompts, batch 1)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write `fig` as a PNG at `path` and close it."""
    path = Path(path)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
