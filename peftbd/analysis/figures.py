"""The report's figures (PNG, Agg backend), each a pure function of results.json.

Figure 1: throughput vs mean accepted tokens per round, one point per arm. Figure 2: acceptance
rate vs draft position, one line per speculative arm, beside the loss's gamma^j. Figure 3:
aggregate throughput and speedup vs AR against the batch size, one line per arm. Figure 4:
speedup vs AR against accepted tokens per round under each round-cost source. Figure 5: accepted
tokens per round against the temperature, one line per arm that samples.

Arms can coincide (the 1-step and anchored PEFT-BD points often do), so no marker may hide
another: each arm has its own colour and shape, all markers are hollow and each is smaller than
the one drawn before it (and drawn above it); Figure 1 also names every point where the name
stays inside the axes and overlaps no marker and no other name.

No text may hide another or the data: every legend sits outside the axes (right of them, one per
figure), long panel titles wrap, and the constrained layout makes room for all of it.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.legend import Legend  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from peftbd.analysis import break_even  # noqa: E402
from peftbd.analysis.acceptance import prefix_gamma  # noqa: E402
from peftbd.benchmarking.schema import Arm, Results  # noqa: E402

MARKERS = "osD^vP*Xh"
LARGEST_MARKER, MARKER_STEP = 16.0, 1.5
LABEL_LINE = 9.0  # points between stacked point names
LABEL_LINES = (0, 1, -1, 2, -2, 3)  # lines below (+) or above (-) its point a name may move
PANEL_TITLE_CHARS = 42  # a Figure 4 panel title wraps at this many characters a line


def _marker_style(i: int) -> dict[str, Any]:
    """Line2D keywords of the i-th arm (in report order): its colour and shape, hollow, smaller
    than and drawn above every arm before it."""
    return {"color": f"C{i}", "marker": MARKERS[i % len(MARKERS)], "markerfacecolor": "none",
            "markersize": max(LARGEST_MARKER - MARKER_STEP * i, 4.0), "markeredgewidth": 1.8,
            "zorder": 3 + i}


def _gaps(values: Sequence[float | None]) -> list[float]:
    """`values` with None (not measured) as NaN: a gap in the line, as matplotlib draws None."""
    return [math.nan if v is None else v for v in values]


def _figure(width: float, height: float, panels: int = 1) -> tuple[Figure, list[Axes]]:
    """A figure of `panels` axes side by side under the constrained layout (room for titles,
    labels and an outside legend)."""
    fig, axes = plt.subplots(1, panels, figsize=(width, height), dpi=120, squeeze=False,
                             layout="constrained")
    return fig, list(axes[0])


def _legend_right(fig: Figure, axes: Sequence[Axes], fontsize: float = 7) -> Legend:
    """One legend right of all `axes`, of their labelled artists (each label once), so that it
    hides no data."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    return fig.legend(list(entries.values()), list(entries), loc="outside right upper",
                      fontsize=fontsize, markerscale=0.6)


def _freeze_layout(fig: Figure) -> None:
    """Lay `fig` out now and keep that layout (text added later must not move the axes)."""
    fig.draw_without_rendering()
    fig.set_layout_engine("none")


def _marker_box(ax: Axes, x: float, y: float, size: float) -> Bbox:
    """The display-space square a marker of `size` points covers at (x, y)."""
    (cx, cy), half = ax.transData.transform((x, y)), size / 2 * ax.figure.dpi / 72
    return Bbox.from_extents(cx - half, cy - half, cx + half, cy + half)


Point = tuple[float, float, str, dict[str, Any]]
"""A named point: (x, y, its name, its marker style)."""


def _label_points(fig: Figure, ax: Axes, points: list[Point]) -> None:
    """Name each point, right of it or else left of it, where the name stays inside the axes and
    overlaps no marker, no error bar and no earlier name, moving a line down or up at a time
    (LABEL_LINES) until it does; no name where none fits near it (the legend names every arm).
    Call after the layout is final."""
    canvas = fig.canvas  # Agg's (this module's backend): it measures text with its renderer
    if not isinstance(canvas, FigureCanvasAgg):
        raise TypeError(f"figures draw on the Agg backend, not on {type(canvas).__name__}")
    renderer = canvas.get_renderer()
    placed = [*(_marker_box(ax, x, y, style["markersize"]) for x, y, _, style in points),
              *_bar_boxes(ax)]
    frame = ax.bbox
    spots = [(side * 10, 4 - LABEL_LINE * line, side)
             for line in LABEL_LINES for side in (1, -1)]
    for x, y, text, style in points:
        for dx, dy, side in spots:
            label = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points",
                                fontsize=7, color=style["color"], va="center",
                                ha="left" if side > 0 else "right", annotation_clip=False)
            box = label.get_window_extent(renderer)
            if _inside(box, frame) and not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            label.remove()


def _bar_boxes(ax: Axes) -> list[Bbox]:
    """The display-space boxes of the error bars drawn on `ax` (one per bar segment)."""
    return [Bbox(ax.transData.transform(segment)).padded(2)
            for bars in ax.collections if isinstance(bars, LineCollection)
            for segment in bars.get_segments()]


def _inside(box: Bbox, frame: Bbox) -> bool:
    """Whether `box` lies wholly within `frame`."""
    return frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1


def _tps_error(arm: Arm) -> list[list[float]] | float | None:
    """Figure 1's throughput bar: the 95% interval over the prompts, else the std over more than
    one repeat, else none (one run has no spread)."""
    tps = arm.tokens_per_s
    if tps.ci95:
        return [[tps.mean - tps.ci95[0]], [tps.ci95[1] - tps.mean]]
    return tps.std if len(arm.repeats) > 1 and tps.std else None


def throughput_vs_accepted(results: Results) -> Figure:
    """Figure 1: each arm's mean throughput (error bar: `_tps_error`) against its mean accepted
    tokens per round (error bar: its 95% interval over the prompts, else std over runs)."""
    fig, (ax,) = _figure(10.0, 4.8)
    points: list[Point] = []
    for i, (_, arm) in enumerate(results.arm_items()):
        acc, style = arm.mean_accepted, _marker_style(i)
        ci = arm.mean_accepted_ci95
        xerr = [[acc.mean - ci[0]], [ci[1] - acc.mean]] if ci else acc.std or None
        ax.errorbar(acc.mean, arm.tokens_per_s.mean, xerr=xerr, yerr=_tps_error(arm),
                    linestyle="none", capsize=4, label=arm.label, **style)
        points.append((acc.mean, arm.tokens_per_s.mean, arm.label, style))
    mo = results.measured_on
    ax.set_xlabel("mean accepted tokens per round")
    ax.set_ylabel("output tokens / s (batch 1, greedy)")
    ax.set_title(f"Throughput vs accepted length\n{mo.model} · {mo.hardware}", fontsize=9)
    ax.margins(x=0.3, y=0.15)
    ax.grid(alpha=0.3)
    _legend_right(fig, [ax])
    _freeze_layout(fig)
    _label_points(fig, ax, points)
    return fig


def acceptance_by_position(results: Results) -> Figure:
    """Figure 2: per speculative arm, the share of rounds proposing position j whose accepted
    prefix reached j, against j; dashed: gamma^j at the PEFT-BD training gamma."""
    fig, (ax,) = _figure(10.0, 4.4)
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
    _legend_right(fig, [ax])
    return fig


def throughput_vs_batch(results: Results) -> Figure:
    """Figure 3: per arm (results.json `concurrency`), aggregate tok/s (left, log scale) and
    speedup vs AR (right; dashed: 1.0, where drafting stops paying) against the batch size."""
    fig, (left, right) = _figure(12.0, 4.4, panels=2)
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
    left.set_yscale("log")
    _legend_right(fig, [left, right])
    mo = results.measured_on
    fig.suptitle(f"Throughput and speedup vs batch size\n{mo.model} · {mo.hardware}", fontsize=9)
    return fig


KEY = [("o", "none", "this run's acceptance"), ("*", "k", "reference acceptance (paper / synthetic)"),
       ("x", "k", "break-even (speedup 1.0)")]
"""Figure 4's marker key: (marker, face colour, meaning)."""


def speedup_vs_accepted(results: Results) -> Figure:
    """Figure 4: per round-cost source (a panel each, its name wrapped as the title), every arm
    with a reference acceptance: speedup over AR against accepted tokens per round
    (`peftbd.analysis.break_even`), with markers at this run's acceptance (o), the reference's
    (*) and the break-even point (x); one legend of arms and markers right of the panels."""
    sources, refs = break_even.cost_sources(results), break_even.reference_acceptance(results)
    fig, axes = _figure(3.6 * max(len(sources), 1) + 2.6, 4.4, panels=max(len(sources), 1))
    top = max([ref for ref, _ in refs.values()] + [2.0]) + 1
    for ax, src in zip(axes, sources):
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
        ax.set_title(textwrap.fill(src.name, PANEL_TITLE_CHARS), fontsize=8)
        ax.set_xlabel("accepted tokens per round\n(bonus included)")
        ax.set_ylabel("speedup vs greedy AR")
        ax.grid(alpha=0.3)
    for marker, face, meaning in KEY:  # drawn nowhere: the legend's key to the markers
        axes[0].plot([], [], marker, color="k", markerfacecolor=face, label=meaning)
    _legend_right(fig, axes)
    fig.suptitle("Speedup vs acceptance under each round-cost source", fontsize=9)
    return fig


def acceptance_vs_temperature(results: Results) -> Figure:
    """Figure 5: per arm with sampled entries (results.json `sampling`; not the synthetic arms),
    accepted tokens per round (bonus included) against the temperature (0: greedy). Needs a run
    with sampling (`peftbd.analysis.sampling.sampled`)."""
    block = results.sampling
    if block is None:
        raise ValueError("results.json has no `sampling`: this run sampled no temperatures")
    fig, (ax,) = _figure(10.0, 4.4)
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
    _legend_right(fig, [ax])
    return fig


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write `fig` as a PNG at `path` and close it."""
    path = Path(path)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
